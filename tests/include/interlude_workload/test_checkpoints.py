"""The checkpoint contract against a real GCS emulator: commit order, verification, retention, control."""

from __future__ import annotations

import json

import pytest

from interlude_workload.checkpoints import COMMITTED, MANIFEST, CheckpointStore, crc32c_b64, sha256_hex


def _store(bucket: str, stage: str = "train") -> CheckpointStore:
    return CheckpointStore(bucket, "run-a1", stage)


def test_write_then_latest_reads_back_manifest(bucket: str) -> None:
    store = _store(bucket)
    result = store.write(12, {"arrays.npz": b"abc"}, metrics={"loss": 0.5}, extra={"k": 1})
    assert result.written
    assert result.checkpoint.uri == f"gs://{bucket}/interlude/run-a1/train/step-00000012/"
    latest = store.latest()
    assert latest.checkpoint is not None and latest.checkpoint.step == 12
    manifest = latest.checkpoint.manifest
    assert manifest["run_key"] == "run-a1" and manifest["stage"] == "train" and manifest["step"] == 12
    assert manifest["files"]["arrays.npz"] == {"size": 3, "sha256": sha256_hex(b"abc"), "crc32c": crc32c_b64(b"abc")}
    assert manifest["metrics"] == {"loss": 0.5} and manifest["created_at"].endswith("Z")
    assert latest.checkpoint.committed_at is not None
    assert store.load(latest.checkpoint) == {"arrays.npz": b"abc"}


def test_uncommitted_step_is_skipped_with_reason(bucket: str) -> None:
    store = _store(bucket)
    store.write(5, {"p": b"five"})
    store.write(10, {"p": b"ten"})
    store.bucket.blob(store.step_prefix(10) + COMMITTED).delete()
    latest = store.latest(verify="full")
    assert latest.checkpoint is not None and latest.checkpoint.step == 5
    assert [(r.step, r.corrupt) for r in latest.rejected] == [(10, False)]
    assert "not committed" in latest.rejected[0].reason
    checkpoint, files, rejected = store.restore()
    assert checkpoint is not None and checkpoint.step == 5 and files == {"p": b"five"}


def test_bad_checksum_is_rejected_as_corrupt(bucket: str) -> None:
    store = _store(bucket)
    store.write(5, {"p": b"five"})
    store.write(10, {"p": b"ten!"})
    store.bucket.blob(store.step_prefix(10) + "p").upload_from_string(b"TEN!")  # same size, other bytes
    latest = store.latest()
    assert latest.checkpoint is not None and latest.checkpoint.step == 5
    assert latest.corrupt and latest.corrupt[0].step == 10 and "crc32c" in latest.corrupt[0].reason
    assert store.restore()[0].step == 5


def test_tampered_manifest_is_rejected(bucket: str) -> None:
    store = _store(bucket)
    store.write(5, {"p": b"five"})
    store.write(10, {"p": b"ten"})
    blob = store.bucket.blob(store.step_prefix(10) + MANIFEST)
    manifest = json.loads(blob.download_as_bytes())
    manifest["metrics"] = {"loss": 0.0}
    blob.upload_from_string(json.dumps(manifest))
    latest = store.latest()
    assert latest.checkpoint.step == 5 and "COMMITTED" in latest.corrupt[0].reason


def test_committed_step_is_never_overwritten(bucket: str) -> None:
    store = _store(bucket)
    store.write(7, {"p": b"original"})
    again = store.write(7, {"p": b"different"})
    assert not again.written
    assert store.load(store.latest().checkpoint) == {"p": b"original"}


def test_corrupt_committed_step_is_uncommitted_and_rewritten(bucket: str) -> None:
    store = _store(bucket)
    store.write(7, {"p": b"original"})
    store.bucket.blob(store.step_prefix(7) + "p").upload_from_string(b"garbage!")
    assert store.latest().checkpoint is None
    assert store.write(7, {"p": b"original"}).written
    assert store.load(store.latest().checkpoint) == {"p": b"original"}


def test_retention_keeps_last_k_and_never_the_latest(bucket: str) -> None:
    store = _store(bucket)
    for step in (1, 2, 3, 4, 5):
        store.write(step, {"p": str(step).encode()})
    store.bucket.blob(store.step_prefix(6) + "p").upload_from_string(b"partial")  # in-progress write
    store.bucket.blob(store.step_prefix(5) + "p").upload_from_string(b"X")  # corrupt newest commit
    assert store.retain(2) == [1, 2, 3]
    assert [(s.step, s.committed) for s in store.scan()] == [(4, True), (5, True), (6, False)]
    assert store.latest().checkpoint.step == 4  # the latest verified one survived although 5 and 6 exist


def test_retention_removes_stale_partial_writes_below_latest(bucket: str) -> None:
    store = _store(bucket)
    store.bucket.blob(store.step_prefix(3) + "p").upload_from_string(b"killed mid-write")
    store.write(4, {"p": b"4"})
    assert store.retain(3) == [3]


def test_control_request_and_acknowledgement(bucket: str) -> None:
    store = _store(bucket)
    assert store.checkpoint_for_request("req-1") is None
    store.request_checkpoint("req-1", reason="maintenance")
    store.request_checkpoint("req-2")
    assert store.pending_requests() == ["req-1", "req-2"]
    store.acknowledge("req-1", 40)
    assert store.pending_requests() == ["req-2"]
    assert store.checkpoint_for_request("req-1") == 40
    with pytest.raises(ValueError):
        store.request_checkpoint("../evil")


def test_progress_logs_and_wipe(bucket: str) -> None:
    store = _store(bucket)
    store.write_progress({"step": 3})
    assert store.read_progress() == {"step": 3}
    store.write_log_chunk("20240101T000000.000001-1", 0, ["one", "two"])
    store.write_log_chunk("20240101T000000.000001-1", 1, ["three"])
    assert store.read_log() == "one\ntwo\nthree\n"
    assert store.read_log(tail_chunks=1) == "three\n"
    store.write(1, {"p": b"1"})
    other_stage = _store(bucket, "finetune")
    other_stage.write(1, {"p": b"1"})
    assert store.wipe() > 0
    assert store.scan() == [] and store.read_progress() is None
    assert other_stage.latest().checkpoint.step == 1


@pytest.mark.parametrize("run_key,stage", [("Bad", "train"), ("ok", "a/b"), ("", "train")])
def test_names_are_validated(run_key: str, stage: str) -> None:
    with pytest.raises(ValueError):
        CheckpointStore("bucket", run_key, stage, client=object())  # type: ignore[arg-type]
