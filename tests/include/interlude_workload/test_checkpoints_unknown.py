"""Nothing committed is deleted or overwritten on an unknown: a read that failed is never a verdict.

Each test puts a real HTTP proxy between the checkpoint store and the real GCS emulator that answers 403 to
chosen requests (as GCS does for a caller whose role lost ``storage.objects.get``), and checks what is left
in the bucket through the emulator directly, not through the proxy or the store's own account.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from urllib.parse import unquote

import pytest

from interlude_workload.checkpoints import COMMITTED, MANIFEST, CheckpointStore, CheckpointUnreadable
from interlude_workload.testing import GcsEmulator
from tests.faults.support import failing_gcs_proxy

RUN, STAGE = "run-u1", "train"


class Wire:
    """What the proxy saw (method, decoded path), and which of it the test makes fail."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.rules: list[Callable[[str, str], bool]] = []
        self._lock = threading.Lock()

    def __call__(self, method: str, path_qs: str) -> bool:
        path = unquote(path_qs)
        with self._lock:
            self.seen.append((method, path))
        return any(rule(method, path) for rule in self.rules)

    def fail_reads_of(self, *names: str) -> None:
        """403 on every download of these objects (step-relative names like ``step-00000010/COMMITTED``)."""
        self.rules.append(lambda m, p: m == "GET" and "/download/" in p and any(f"/{n}?" in p for n in names))

    def fail_uploads(self) -> None:
        self.rules.append(lambda m, p: p.startswith("/upload/"))

    def mutations(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.seen if m in {"DELETE", "POST", "PUT", "PATCH"}]


def _direct(gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch) -> CheckpointStore:
    """A store that talks to the emulator itself (the independent view of what is left)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    return CheckpointStore(bucket, RUN, STAGE)


def _names(store: CheckpointStore) -> list[str]:
    return sorted(b.name[len(store.base) :] for b in store.client.list_blobs(store.bucket_name, prefix=store.base))


def _seed(gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch, steps: list[int]) -> list[str]:
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    for step in steps:
        direct.write(step, {"weights.bin": bytes([step]) * 32}, metrics={"step": step})
    return _names(direct)


def test_a_403_on_committed_then_a_failed_upload_leaves_the_step_committed_and_restorable(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _seed(gcs_emulator, bucket, monkeypatch, [10])
    faults = Wire()
    proxy = failing_gcs_proxy(gcs_emulator.endpoint, faults)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        faults.fail_reads_of(f"step-00000010/{COMMITTED}")
        faults.fail_uploads()
        with pytest.raises(CheckpointUnreadable, match="403"):
            CheckpointStore(bucket, RUN, STAGE).write(10, {"weights.bin": b"other bytes"})
    finally:
        proxy.stop()
    assert faults.mutations() == [], "an unknown must not lead to a delete or an upload"
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    assert _names(direct) == before
    checkpoint, files, rejected = direct.restore()
    assert checkpoint is not None and checkpoint.step == 10 and rejected == []
    assert files == {"weights.bin": bytes([10]) * 32}


def test_a_step_proved_bad_by_a_successful_read_is_still_rewritten(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repair path stays: a COMMITTED that was read and does not match its manifest is replaced."""
    _seed(gcs_emulator, bucket, monkeypatch, [10])
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    direct.bucket.blob(direct.step_prefix(10) + COMMITTED).upload_from_string(b"0" * 64)
    assert direct.write(10, {"weights.bin": b"again"}).written
    assert direct.latest(verify="full").checkpoint.step == 10


@pytest.mark.parametrize("unreadable", [COMMITTED, MANIFEST, "weights.bin"])
def test_restore_does_not_fall_back_past_an_unreadable_step(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch, unreadable: str
) -> None:
    """Falling back to step 5 would resume there and then train over (rewrite) the committed step 10."""
    before = _seed(gcs_emulator, bucket, monkeypatch, [5, 10])
    faults = Wire()
    proxy = failing_gcs_proxy(gcs_emulator.endpoint, faults)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        faults.fail_reads_of(f"step-00000010/{unreadable}")
        store = CheckpointStore(bucket, RUN, STAGE)
        with pytest.raises(CheckpointUnreadable, match=unreadable):
            store.restore()
        with pytest.raises(CheckpointUnreadable):
            store.latest(verify="full")
    finally:
        proxy.stop()
    assert faults.mutations() == []
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    assert _names(direct) == before and direct.restore()[0].step == 10


def test_retention_deletes_nothing_while_a_committed_step_is_unreadable(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps 3 and 4 unreadable: treating them as corrupt made step 2 "the latest" and deleted step 3, the one
    to fall back to if step 4 does turn out bad."""
    before = _seed(gcs_emulator, bucket, monkeypatch, [1, 2, 3, 4])
    faults = Wire()
    proxy = failing_gcs_proxy(gcs_emulator.endpoint, faults)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        faults.fail_reads_of(f"step-00000003/{COMMITTED}", f"step-00000004/{COMMITTED}")
        with pytest.raises(CheckpointUnreadable):
            CheckpointStore(bucket, RUN, STAGE).retain(keep=1)
    finally:
        proxy.stop()
    assert faults.mutations() == []
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    assert _names(direct) == before
    assert direct.retain(keep=1) == [1, 2, 3]  # once readable, retention does its work


def test_a_step_deleted_since_the_listing_is_not_corrupt(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 404 is a verdict: retention took the step (COMMITTED first) between the listing and the reads."""
    _seed(gcs_emulator, bucket, monkeypatch, [5, 10])
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    listed = direct.scan()
    for name in (COMMITTED, MANIFEST):
        direct.bucket.blob(direct.step_prefix(10) + name).delete()
    checkpoint, reason = direct.verify(listed[-1])
    assert checkpoint is None and reason is not None and "deleted since the listing" in reason


def test_the_failure_callback_says_unknown_not_no_checkpoint(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a person reads after a failed run: an unreadable step is "unknown", never "no committed checkpoint"."""
    from interlude.training.callbacks import resume_points

    _seed(gcs_emulator, bucket, monkeypatch, [10])
    faults = Wire()
    proxy = failing_gcs_proxy(gcs_emulator.endpoint, faults)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        faults.fail_reads_of(f"step-00000010/{COMMITTED}")
        points = resume_points(bucket, RUN)
    finally:
        proxy.stop()
    assert points[STAGE].startswith("unknown") and "403" in points[STAGE]
    assert points["finetune"] == "no committed checkpoint"
