"""Nothing committed is deleted or overwritten on an unknown: a read that failed is never a verdict.

Each test puts a real HTTP proxy between the checkpoint store (and Orbax: its tensorstore and gcsfs clients follow the
store's endpoint) and the real GCS emulator; the proxy answers 403 to chosen requests (as GCS does for a caller whose
role lost ``storage.objects.get``). What is left in the bucket is checked through the emulator directly, not through
the proxy or the store's own account.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

from interlude_workload.checkpoints import (
    COMMIT_SUCCESS,
    STEP_METADATA,
    CheckpointStore,
    CheckpointUnreadable,
)
from interlude_workload.testing import GcsEmulator
from tests.faults.support import failing_gcs_proxy

from .trainer_proc import run_trainer, trainer_cmd

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
        """403 on every read of these objects (names relative to the stage's checkpoints/, like
        ``10/_CHECKPOINT_METADATA`` or ``10/state/ocdbt``, a prefix): downloads and metadata GETs, by any client
        (google-cloud-storage's ``/download/...``, gcsfs's and tensorstore's ``/storage/v1/b/B/o/NAME``)."""

        def rule(method: str, path: str) -> bool:
            target = path.split("?", 1)[0]
            return method == "GET" and "/o/" in target and any(f"/checkpoints/{n}" in target for n in names)

        self.rules.append(rule)

    def fail_uploads(self) -> None:
        self.rules.append(lambda m, p: p.startswith("/upload/"))

    def mutations(self, under: str = "") -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.seen if m in {"DELETE", "POST", "PUT", "PATCH"} and under in p]


def _direct(gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch) -> CheckpointStore:
    """A store that talks to the emulator itself (the independent view of what is left)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    return CheckpointStore(bucket, RUN, STAGE)


def _names(store: CheckpointStore) -> list[tuple[str, int]]:
    """Every object of the stage with its generation: a rewrite changes it even with the same bytes."""
    blobs = store.client.list_blobs(store.bucket_name, prefix=store.base)
    return sorted((b.name[len(store.base) :], int(b.generation)) for b in blobs)


def _seed(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch, steps: list[int]
) -> list[tuple[str, int]]:
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    for step in steps:
        direct.write(step, {"w": np.full(32, step, dtype=np.uint8)}, metrics={"step": step})
    return _names(direct)


def _value(items: dict) -> int:
    return int(items["state"]["w"][0])


def test_a_403_on_the_step_metadata_then_a_failed_upload_leaves_the_step_committed_and_restorable(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _seed(gcs_emulator, bucket, monkeypatch, [10])
    faults = Wire()
    proxy = failing_gcs_proxy(gcs_emulator.endpoint, faults)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        faults.fail_reads_of(f"10/{STEP_METADATA}")
        faults.fail_uploads()
        with pytest.raises(CheckpointUnreadable, match="403"):
            CheckpointStore(bucket, RUN, STAGE).write(10, {"w": np.zeros(32, dtype=np.uint8)})
    finally:
        proxy.stop()
    assert faults.mutations() == [], "an unknown must not lead to a delete or an upload"
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    assert _names(direct) == before
    checkpoint, items, rejected = direct.restore()
    assert checkpoint is not None and checkpoint.step == 10 and rejected == [] and _value(items) == 10


def test_a_step_proved_bad_by_a_successful_read_is_still_rewritten(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repair path stays: a step metadata that was read and is not Orbax's is deleted and saved again."""
    _seed(gcs_emulator, bucket, monkeypatch, [10])
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    direct.bucket.blob(direct.step_prefix(10) + STEP_METADATA).upload_from_string(b"not json")
    assert direct.write(10, {"w": np.full(32, 7, dtype=np.uint8)}).written
    latest = direct.latest(verify="full").checkpoint
    assert latest is not None and latest.step == 10 and _value(direct.load(latest)) == 7


@pytest.mark.parametrize("unreadable", [STEP_METADATA, "state/_METADATA", "state/manifest.ocdbt", "state/d/"])
def test_restore_does_not_fall_back_past_an_unreadable_step(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch, unreadable: str
) -> None:
    """Falling back to step 5 would resume there and then train over (rewrite) the committed step 10. The
    unreadable object is read by each of Orbax's clients in turn: the step metadata by Interlude's listing check,
    the item metadata by gcsfs, the arrays by tensorstore."""
    before = _seed(gcs_emulator, bucket, monkeypatch, [5, 10])
    faults = Wire()
    proxy = failing_gcs_proxy(gcs_emulator.endpoint, faults)
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        faults.fail_reads_of(f"10/{unreadable}")
        store = CheckpointStore(bucket, RUN, STAGE)
        with pytest.raises(CheckpointUnreadable):
            store.restore()
        with pytest.raises(CheckpointUnreadable):
            store.latest(verify="full")
    finally:
        proxy.stop()
    assert faults.mutations() == []
    assert any(unreadable in path for method, path in faults.seen if method == "GET"), "the read was not tried"
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    assert _names(direct) == before
    checkpoint, items, _ = direct.restore()
    assert checkpoint.step == 10 and _value(items) == 10


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
        faults.fail_reads_of(f"3/{STEP_METADATA}", f"4/{STEP_METADATA}")
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
    """A 404 is a verdict: retention took the step (markers first) between the listing and the reads."""
    _seed(gcs_emulator, bucket, monkeypatch, [5, 10])
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    listed = direct.scan()
    for name in (COMMIT_SUCCESS, STEP_METADATA):
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
        faults.fail_reads_of(f"10/{STEP_METADATA}")
        points = resume_points(bucket, RUN)
    finally:
        proxy.stop()
    assert points[STAGE].startswith("unknown") and "403" in points[STAGE]
    assert points["finetune"] == "no committed checkpoint"


def test_the_trainer_does_not_train_over_a_step_whose_arrays_it_cannot_read(
    gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The real trainer resuming through the SDK: its latest step's arrays answer 403 (tensorstore's reads). It must
    stop (and be retried), not resume from step 5 and save steps 6..10 over the committed step 10."""
    direct = _direct(gcs_emulator, bucket, monkeypatch)
    first = run_trainer(trainer_cmd(bucket, RUN, steps=10, every=5, stage=STAGE), timeout=180)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _names(direct)
    faults = Wire()
    proxy = failing_gcs_proxy(gcs_emulator.endpoint, faults)
    try:
        faults.fail_reads_of("10/state/d/")
        cmd = trainer_cmd(bucket, RUN, steps=20, every=5, stage=STAGE)
        done = run_trainer(cmd, timeout=180, STORAGE_EMULATOR_HOST=proxy.endpoint)
    finally:
        proxy.stop()
    assert done.returncode not in (0, 143), done.stdout[-3000:]
    assert "CheckpointUnreadable" in done.stderr + done.stdout, done.stderr[-3000:]
    assert faults.mutations(under="/checkpoints/") == [], "a checkpoint was written or deleted on an unknown"
    assert [(n, g) for n, g in _names(direct) if n.startswith("checkpoints/")] == [
        (n, g) for n, g in before if n.startswith("checkpoints/")
    ]
