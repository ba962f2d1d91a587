"""CommittedCheckpointSensor, deferrable and not, against a real GCS emulator and a real trainer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from interlude.sensors.checkpoint import CommittedCheckpointSensor
from interlude.triggers.checkpoint import CheckpointTrigger
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.testing import GcsEmulator


@pytest.fixture
def gcs(gcs_emulator: GcsEmulator) -> GcsEmulator:
    return gcs_emulator  # the session's emulator (tests/conftest.py)


@pytest.fixture
def store(gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> CheckpointStore:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    bucket = f"s-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(bucket)
    return CheckpointStore(bucket, "run-s", "train")


def _sensor(store: CheckpointStore, min_step: int, deferrable: bool, **kwargs: object) -> CommittedCheckpointSensor:
    return CommittedCheckpointSensor(
        task_id=f"wait_{uuid.uuid4().hex[:6]}",
        bucket=store.bucket_name,
        run_key=store.run_key,
        stage=store.stage,
        min_step=min_step,
        deferrable=deferrable,
        poll_interval=0.1,
        **kwargs,
    )


def _corrupt(store: CheckpointStore, step: int) -> None:
    """Finalised, but an item lost its commit marker (a step half-deleted by something else than Interlude)."""
    store.bucket.blob(store.step_prefix(step) + "state/commit_success.txt").delete()


@pytest.mark.parametrize("deferrable", [True, False])
def test_satisfied_at_once(store: CheckpointStore, deferrable: bool) -> None:
    store.write(10, {"w": np.frombuffer(b"weights", np.uint8)})
    result = _sensor(store, 10, deferrable).execute(context={})
    assert result == {"step": 10, "uri": store.uri(10)}


def test_deferrable_waits_in_the_trigger_then_completes(store: CheckpointStore) -> None:
    store.write(5, {"w": np.frombuffer(b"five", np.uint8)})
    sensor = _sensor(store, 10, True, stall_timeout=60)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context={})
    trigger = deferred.value.trigger
    assert isinstance(trigger, CheckpointTrigger) and deferred.value.method_name == "execute_complete"
    assert trigger.serialize()[1]["min_step"] == 10

    async def run() -> dict[str, object]:
        task = asyncio.ensure_future(anext(trigger.run()))
        await asyncio.sleep(0.4)
        assert not task.done()
        await asyncio.to_thread(store.write, 10, {"w": np.frombuffer(b"ten", np.uint8)})
        return (await asyncio.wait_for(task, 20)).payload

    event = asyncio.run(run())
    assert sensor.execute_complete(context={}, event=event) == {"step": 10, "uri": store.uri(10)}


@pytest.mark.parametrize("deferrable", [True, False])
def test_corrupt_checkpoint_fails_in_both_modes(store: CheckpointStore, deferrable: bool) -> None:
    store.write(10, {"w": np.frombuffer(b"weights", np.uint8)})
    _corrupt(store, 10)
    with pytest.raises(AirflowFailException, match="corrupt"):
        _sensor(store, 10, deferrable).execute(context={})


@pytest.mark.parametrize("deferrable", [True, False])
def test_stall_fails_in_both_modes(store: CheckpointStore, deferrable: bool) -> None:
    store.write(3, {"w": np.frombuffer(b"three", np.uint8)})
    sensor = _sensor(store, 10, deferrable, stall_timeout=0.5)
    if not deferrable:
        with pytest.raises(AirflowException, match="stalled"):
            sensor.execute(context={})
        return
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context={})
    event = asyncio.run(asyncio.wait_for(anext(deferred.value.trigger.run()), 20)).payload
    assert event["reason"] == "stalled"
    with pytest.raises(AirflowException, match="stalled"):
        sensor.execute_complete(context={}, event=event)


def test_execute_complete_rejects_anything_but_success(store: CheckpointStore) -> None:
    sensor = _sensor(store, 1, True)
    for event in (None, {"status": "waiting"}, {"status": "error", "reason": "unreachable", "message": "x"}):
        with pytest.raises(AirflowException):
            sensor.execute_complete(context={}, event=event)


def test_sync_sensor_waits_for_a_real_trainer(store: CheckpointStore) -> None:
    cmd = [
        sys.executable,
        "-m",
        "interlude_workload.train",
        "--bucket",
        store.bucket_name,
        "--run-key",
        store.run_key,
        "--stage",
        "train",
        "--steps",
        "30",
        "--checkpoint-every",
        "10",
        "--step-seconds",
        "0.05",
        "--no-maintenance-watch",
    ]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # The trainer's start (JAX's import and compile) took over 30 s at load 13-17 in a full run: the stall rule
        # is test_stall's business (0.5 s), here the sensor only has to wait for the real trainer's commit.
        result = _sensor(store, 20, False, stall_timeout=300).execute(context={})
        assert result["step"] >= 20
        assert proc.wait(timeout=300) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
