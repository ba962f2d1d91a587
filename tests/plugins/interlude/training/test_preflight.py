"""Preflight against a real local cloud and GCS emulator: unknown zones and unusable buckets are refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from interlude.training.preflight import check
from interlude.training.spec import RunSpec, RunSpecError


@pytest.fixture(scope="module")
def compute() -> Iterator[Any]:
    from interlude.hooks.compute import ComputeHook
    from interlude_localcloud.testing import running_localcloud

    with running_localcloud("default", strict=True, gcs=False) as lc:
        yield ComputeHook(gcp_conn_id=None, compute_endpoint=lc.api_endpoint, project_id=lc.project)


def test_existing_zones_and_writable_bucket_pass(compute: Any, bucket: str) -> None:
    from interlude_workload.gcs import storage_client

    spec = RunSpec(bucket=bucket, run_key="k-preflight")
    check(spec, compute, storage_client())
    # The probe object is removed again: preflight leaves nothing behind.
    assert list(storage_client().list_blobs(bucket)) == []


def test_unknown_zone_is_refused_by_name(compute: Any, bucket: str) -> None:
    from interlude_workload.gcs import storage_client

    spec = RunSpec(bucket=bucket, zones=("mars-north1-z", "us-central1-a"), run_key="k")
    with pytest.raises(RunSpecError) as info:
        check(spec, compute, storage_client())
    assert "zones: 'mars-north1-z' does not exist" in str(info.value)
    assert "us-central1-a" not in str(info.value)


def test_missing_bucket_is_refused_by_name(compute: Any, bucket: str) -> None:
    from interlude_workload.gcs import storage_client

    spec = RunSpec(bucket=bucket + "-missing", run_key="k")
    with pytest.raises(RunSpecError) as info:
        check(spec, compute, storage_client())
    assert "bucket: gs://" in str(info.value) and "does not exist" in str(info.value)


# Roles that grant `storage.objects.create` (https://cloud.google.com/storage/docs/access-control/iam-roles).
WRITE_ROLES = frozenset(
    {
        "roles/storage.admin",
        "roles/storage.objectAdmin",
        "roles/storage.objectCreator",
        "roles/storage.objectUser",
        "roles/storage.legacyBucketOwner",
        "roles/storage.legacyBucketWriter",
    }
)
ANONYMOUS = "allUsers"  # the identity of the emulator's anonymous client


def may_write(policy: dict[str, Any], member: str = ANONYMOUS) -> bool:
    """Whether a bucket's IAM policy lets `member` create objects."""
    return any(b["role"] in WRITE_ROLES and member in b.get("members", []) for b in policy.get("bindings", []))


def iam_enforcing_proxy(upstream: str) -> Any:
    """A real HTTP proxy in front of the GCS emulator that enforces each bucket's stored IAM policy on writes.

    The emulator stores bucket IAM policies but enforces none (its handler says so), so a bucket cannot be made
    read-only there. This answers every object write (upload, delete, rewrite) the way GCS does when the policy
    grants no create role: 403 with Google's error body. Reads pass untouched.
    """
    import re

    from aiohttp import web

    from benchmarks.counting_proxy import CountingProxy, classify_gcs

    write = re.compile(r"^/(?:upload/)?storage/v1/b/([^/]+)/o(?:/|$)")

    class IamProxy(CountingProxy):
        refused: list[str] = []

        async def _handle(self, request: web.Request) -> web.StreamResponse:
            found = write.match(request.path)
            if request.method not in ("GET", "HEAD") and found and self._session is not None:
                async with self._session.get(f"{upstream}/storage/v1/b/{found.group(1)}/iam") as resp:
                    policy = await resp.json()
                if not may_write(policy):
                    self.refused.append(f"{request.method} {request.path}")
                    message = f"{ANONYMOUS} does not have storage.objects.create access to the bucket."
                    error = {"code": 403, "message": message, "errors": [{"reason": "forbidden", "message": message}]}
                    return web.json_response({"error": error}, status=403)
            return await super()._handle(request)

    return IamProxy(upstream, classify_gcs).start()


def test_a_bucket_the_run_can_read_but_not_write_is_refused_by_name(
    compute: Any, bucket: str, gcs_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readable (bucket get, object list) but no create role: only an actual write shows it, and nothing lands."""
    from interlude_workload.gcs import storage_client

    direct = storage_client()
    policy = direct.bucket(bucket).get_iam_policy()
    policy.bindings = [
        {"role": "roles/storage.legacyBucketReader", "members": {ANONYMOUS}},
        {"role": "roles/storage.objectViewer", "members": {ANONYMOUS}},
    ]
    direct.bucket(bucket).set_iam_policy(policy)
    proxy = iam_enforcing_proxy(gcs_emulator.endpoint)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        through = storage_client()
        assert through.get_bucket(bucket).name == bucket and list(through.list_blobs(bucket)) == []  # readable
        with pytest.raises(RunSpecError) as info:
            check(RunSpec(bucket=bucket, run_key="k-read-only"), compute, through)
    finally:
        proxy.stop()
    assert f"bucket: gs://{bucket} is not writable" in str(info.value)
    assert [r.split(" ")[0] for r in proxy.refused] == ["POST"], proxy.refused  # the probe tried one write
    assert list(direct.list_blobs(bucket)) == []  # the emulator's own view: nothing was written
