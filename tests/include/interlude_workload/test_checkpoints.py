"""The checkpoint contract over Orbax's layout, against a real GCS emulator and real Orbax: what counts as committed,
verification before restore, rewrites, retention, control requests, progress, logs and wipes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from interlude_workload.checkpoints import COMMIT_SUCCESS, STEP_METADATA, CheckpointStore
from interlude_workload.sdk import weights_digest


def _store(bucket: str, stage: str = "train") -> CheckpointStore:
    return CheckpointStore(bucket, "run-a1", stage)


def _state(value: float) -> dict[str, np.ndarray]:
    return {"w": np.full((2, 3), value), "b": np.arange(4, dtype=np.int32) + int(value)}


def _names(store: CheckpointStore, step: int) -> list[str]:
    return sorted(b.name for b in store.client.list_blobs(store.bucket_name, prefix=store.step_prefix(step)))


def _break_arrays(store: CheckpointStore, step: int) -> None:
    """Same sizes, other bytes, in every object of the step's array store (OCDBT data files and manifests)."""
    for blob in store.client.list_blobs(store.bucket_name, prefix=store.step_prefix(step) + "state/"):
        if "/d/" in blob.name or blob.name.endswith(".ocdbt"):
            blob.upload_from_string(bytes(reversed(blob.download_as_bytes())))


def test_a_step_is_an_orbax_step_dir_and_reads_back_exactly(bucket: str) -> None:
    store = _store(bucket)
    arrays = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.array([1, 2], dtype=np.int64)}
    result = store.write(12, arrays, metrics={"loss": 0.5}, extra={"k": 1}, meta={"position": 3})
    assert result.written
    assert result.checkpoint.uri == f"gs://{bucket}/interlude/run-a1/train/checkpoints/12/"
    names = _names(store, 12)
    assert store.step_prefix(12) + COMMIT_SUCCESS in names and store.step_prefix(12) + STEP_METADATA in names
    latest = store.latest()
    assert latest.checkpoint is not None and latest.checkpoint.step == 12 and latest.rejected == []
    assert latest.checkpoint.metrics == {"loss": 0.5} and latest.checkpoint.extra == {"k": 1}
    assert latest.checkpoint.committed_at is not None and latest.checkpoint.format == "orbax"
    items = store.load(latest.checkpoint)
    assert items["meta"] == {"position": 3}
    assert weights_digest(items["state"]) == weights_digest(arrays)  # dtypes, shapes and bytes
    assert weights_digest({"w": arrays["w"].astype(np.float64)}) != weights_digest({"w": arrays["w"]})


def test_a_step_orbax_did_not_finalise_is_skipped_with_reason(bucket: str) -> None:
    store = _store(bucket)
    store.write(5, _state(5))
    store.write(10, _state(10))
    store.bucket.blob(store.step_prefix(10) + COMMIT_SUCCESS).delete()
    latest = store.latest(verify="full")
    assert latest.checkpoint is not None and latest.checkpoint.step == 5
    assert [(r.step, r.corrupt) for r in latest.rejected] == [(10, False)]
    assert "not finalised" in latest.rejected[0].reason
    checkpoint, items, rejected = store.restore()
    assert checkpoint is not None and checkpoint.step == 5 and float(items["state"]["w"][0, 0]) == 5.0
    assert [(r.step, r.corrupt) for r in rejected] == [(10, False)]


@pytest.mark.parametrize(
    "damage,reason",
    [
        (lambda s: s.bucket.blob(s.step_prefix(10) + "state/" + COMMIT_SUCCESS).delete(), "item 'state'"),
        (lambda s: s.bucket.blob(s.step_prefix(10) + STEP_METADATA).upload_from_string(b"{torn"), "not JSON"),
        (lambda s: s.bucket.blob(s.step_prefix(10) + STEP_METADATA).upload_from_string(b"{}"), "no commit time"),
    ],
    ids=["item-marker-gone", "metadata-torn", "metadata-without-commit-time"],
)
def test_a_finalised_step_whose_structure_is_broken_is_rejected_as_corrupt(bucket: str, damage, reason: str) -> None:
    store = _store(bucket)
    store.write(5, _state(5))
    store.write(10, _state(10))
    damage(store)
    latest = store.latest()
    assert latest.checkpoint is not None and latest.checkpoint.step == 5
    assert [r.step for r in latest.corrupt] == [10] and reason in latest.corrupt[0].reason


def test_array_bytes_are_verified_by_the_restore_and_a_bad_step_is_passed_over(bucket: str) -> None:
    """The listing cannot see bad array bytes (Orbax keeps no checksums beside them); the restore reads every array,
    and a step that GCS served whole but Orbax cannot restore is rejected and the one before is used."""
    store = _store(bucket)
    store.write(5, _state(5))
    store.write(10, _state(10))
    _break_arrays(store, 10)
    assert store.latest().checkpoint.step == 10  # metadata alone: nothing to see
    full = store.latest(verify="full")
    assert full.checkpoint.step == 5 and [r.step for r in full.corrupt] == [10]
    checkpoint, items, rejected = store.restore()
    assert checkpoint.step == 5 and float(items["state"]["w"][0, 0]) == 5.0
    assert [(r.step, r.corrupt) for r in rejected] == [(10, True)] and "Orbax cannot restore" in rejected[0].reason


def test_a_committed_step_is_never_overwritten(bucket: str) -> None:
    store = _store(bucket)
    store.write(7, _state(1))
    before = {b.name: b.generation for b in store.client.list_blobs(bucket, prefix=store.step_prefix(7))}
    again = store.write(7, _state(2))
    assert not again.written
    after = {b.name: b.generation for b in store.client.list_blobs(bucket, prefix=store.step_prefix(7))}
    assert after == before
    assert float(store.load(store.latest().checkpoint)["state"]["w"][0, 0]) == 1.0


def test_a_step_proved_corrupt_is_deleted_and_saved_again(bucket: str) -> None:
    store = _store(bucket)
    store.write(7, _state(1))
    store.bucket.blob(store.step_prefix(7) + STEP_METADATA).upload_from_string(b"garbage")
    assert store.latest().checkpoint is None
    assert store.write(7, _state(2)).written
    assert float(store.load(store.latest().checkpoint)["state"]["w"][0, 0]) == 2.0


def test_an_unfinished_leftover_is_replaced_by_a_new_save_of_its_step(bucket: str) -> None:
    store = _store(bucket)
    store.write(3, _state(3))
    store.bucket.blob(store.step_prefix(3) + COMMIT_SUCCESS).delete()  # a save cut short before its marker
    store.bucket.blob(store.step_prefix(3) + "state/stray-object").upload_from_string(b"x")
    assert store.write(3, _state(4)).written
    assert store.step_prefix(3) + "state/stray-object" not in _names(store, 3)
    assert float(store.load(store.latest().checkpoint)["state"]["w"][0, 0]) == 4.0


def test_retention_keeps_last_k_and_never_the_latest(bucket: str) -> None:
    store = _store(bucket)
    for step in (1, 2, 3, 4, 5):
        store.write(step, _state(step))
    store.bucket.blob(store.step_prefix(6) + STEP_METADATA).upload_from_string(b"{}")  # a save in progress
    store.bucket.blob(store.step_prefix(5) + STEP_METADATA).upload_from_string(b"X")  # corrupt newest commit
    assert store.retain(1) == [1, 2, 3]  # keep 1: step 5 by count, step 4 as the latest that verifies
    assert [(s.step, s.committed) for s in store.scan()] == [(4, True), (5, True), (6, False)]
    assert store.latest().checkpoint.step == 4  # the latest verified one survived although 5 and 6 exist
    assert _names(store, 1) == []  # every object of a pruned step, not only its markers


def test_retention_removes_stale_partial_saves_below_latest(bucket: str) -> None:
    store = _store(bucket)
    store.bucket.blob(store.step_prefix(3) + STEP_METADATA).upload_from_string(b"{}")  # killed mid-save
    store.write(4, _state(4))
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
    assert json.loads(store.bucket.get_blob(store.base + "progress.json").metadata["interlude-progress"]) == {"step": 3}
    store.write_log_chunk("20240101T000000.000001-1", 0, ["one", "two"])
    store.write_log_chunk("20240101T000000.000001-1", 1, ["three"])
    assert store.read_log() == "one\ntwo\nthree\n"
    assert store.read_log(tail_chunks=1) == "three\n"
    store.write(1, _state(1))
    other_stage = _store(bucket, "finetune")
    other_stage.write(1, _state(1))
    assert store.wipe() > 0
    assert store.scan() == [] and store.read_progress() is None
    assert list(store.client.list_blobs(bucket, prefix=store.base)) == []
    assert other_stage.latest().checkpoint.step == 1


@pytest.mark.parametrize("run_key,stage", [("Bad", "train"), ("ok", "a/b"), ("", "train")])
def test_names_are_validated(run_key: str, stage: str) -> None:
    with pytest.raises(ValueError):
        CheckpointStore("bucket", run_key, stage, client=object())  # type: ignore[arg-type]
