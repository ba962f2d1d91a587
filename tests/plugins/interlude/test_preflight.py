"""Preflight against a real local cloud and GCS emulator: unknown zones and unusable buckets are refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from interlude.preflight import check
from interlude.spec import RunSpec, RunSpecError


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
