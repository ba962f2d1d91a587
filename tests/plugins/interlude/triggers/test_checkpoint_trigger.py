"""CheckpointTrigger against a real GCS emulator: satisfied, waiting, corrupt rejected, stall detected."""

from __future__ import annotations

import asyncio
import importlib
import time
import uuid
from typing import Any

import numpy as np
import pytest

from interlude.triggers import checkpoint
from interlude.triggers.checkpoint import CheckpointTrigger
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.testing import GcsEmulator


@pytest.fixture
def gcs(gcs_emulator: GcsEmulator) -> GcsEmulator:
    return gcs_emulator  # the session's emulator (tests/conftest.py)


@pytest.fixture
def store(gcs: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> CheckpointStore:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    gcs.create_bucket(bucket)
    return CheckpointStore(bucket, "run-t", "train")


def _trigger(store: CheckpointStore, min_step: int, **kwargs: Any) -> CheckpointTrigger:
    args: dict[str, Any] = {"stall_timeout": 30.0, "since": time.time(), "poll_interval": 0.05, **kwargs}
    return CheckpointTrigger(
        bucket=store.bucket_name, run_key=store.run_key, stage=store.stage, min_step=min_step, **args
    )


async def _events(trigger: CheckpointTrigger, timeout: float = 20.0) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return await asyncio.wait_for(collect(), timeout)


def _corrupt(store: CheckpointStore, step: int) -> None:
    """Finalised, but its step metadata is no longer Orbax's (torn, or written over by something else)."""
    blob = store.bucket.blob(store.step_prefix(step) + "_CHECKPOINT_METADATA")
    blob.upload_from_string(b"X" * len(blob.download_as_bytes()))


def test_serialize_round_trips_through_the_dotted_path(store: CheckpointStore) -> None:
    trigger = _trigger(store, 10, fail_on_corrupt=False)
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    assert path == "interlude.triggers.checkpoint.CheckpointTrigger"
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert rebuilt.serialize() == (path, kwargs)
    import json

    assert json.loads(json.dumps(kwargs)) == kwargs


def test_satisfied_by_existing_committed_checkpoint(store: CheckpointStore) -> None:
    store.write(10, {"w": np.frombuffer(b"ten", np.uint8)})
    store.write(12, {"w": np.frombuffer(b"twelve", np.uint8)})
    events = asyncio.run(_events(_trigger(store, 10)))
    assert len(events) == 1
    assert events[0]["status"] == "success" and events[0]["step"] == 12
    assert events[0]["uri"] == store.uri(12)


def test_waits_until_the_target_step_is_committed(store: CheckpointStore) -> None:
    store.write(10, {"w": np.frombuffer(b"ten", np.uint8)})
    store.bucket.blob(store.step_prefix(20) + "w").upload_from_string(b"partial")  # not committed

    async def scenario() -> list[dict[str, Any]]:
        task = asyncio.ensure_future(_events(_trigger(store, 20)))
        await asyncio.sleep(0.6)
        assert not task.done()  # step 10 and an uncommitted step 20 do not satisfy it
        await asyncio.to_thread(store.write, 20, {"w": np.frombuffer(b"twenty", np.uint8)})
        return await task

    events = asyncio.run(scenario())
    assert [(e["status"], e["step"]) for e in events] == [("success", 20)]


def test_corrupt_checkpoint_is_rejected_and_reported(store: CheckpointStore) -> None:
    store.write(10, {"w": np.frombuffer(b"ten!", np.uint8)})
    store.write(20, {"w": np.frombuffer(b"twenty", np.uint8)})
    _corrupt(store, 20)
    events = asyncio.run(_events(_trigger(store, 20)))
    assert events[0]["status"] == "error" and events[0]["reason"] == "corrupt"
    assert "step 20" in events[0]["message"] and "not JSON" in events[0]["message"]
    # Below the corrupt one the older good checkpoint still counts, and the corruption is reported.
    events = asyncio.run(_events(_trigger(store, 5)))
    assert events[0]["status"] == "success" and events[0]["step"] == 10
    assert [r["step"] for r in events[0]["rejected"]] == [20]


def test_corrupt_not_counted_when_tolerated_ends_as_stall(store: CheckpointStore) -> None:
    store.write(20, {"w": np.frombuffer(b"twenty", np.uint8)})
    _corrupt(store, 20)
    events = asyncio.run(_events(_trigger(store, 20, fail_on_corrupt=False, stall_timeout=0.5)))
    assert events[0]["status"] == "error" and events[0]["reason"] == "stalled"
    assert events[0]["latest_step"] is None


def test_stall_detected_when_no_new_commit_appears(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger looks, sees "waiting" while the quiet is shorter than the stall timeout, and ends "stalled" at
    its first look past it. Each look is told its moment (the n-th, n/8 s into the quiet, exact in binary), so
    which look crosses 0.8 s is a fact of the decision, not of this machine's speed."""
    store.write(10, {"w": np.frombuffer(b"ten", np.uint8)})
    since = time.time()  # after step 10's commit: the quiet is counted from here
    looks: list[str] = []
    real_check = checkpoint.check_checkpoint

    def at_its_moment(**kwargs: Any) -> dict[str, Any]:
        outcome = real_check(**kwargs, now=since + (len(looks) + 1) / 8)
        looks.append(outcome["status"])
        return outcome

    monkeypatch.setattr(checkpoint, "check_checkpoint", at_its_moment)
    events = asyncio.run(_events(_trigger(store, 50, stall_timeout=0.8, since=since)))
    assert events[0]["status"] == "error" and events[0]["reason"] == "stalled"
    assert events[0]["latest_step"] == 10 and "stalled" in events[0]["message"]
    assert looks == ["waiting"] * 6 + ["error"], looks  # 6/8 s of quiet is waiting, 7/8 s a stall


def test_new_commits_keep_a_slow_run_from_counting_as_stalled(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage that began three stall timeouts ago and commits a new step before each look is not stalled: the
    quiet is counted from the newest commit, not from the stage's start. The test owns the clock: before each
    look it commits the next step, and the look is told its moment, half a stall timeout after that commit's
    GCS creation time (the storage clock the trigger reads). A trigger that counted from ``since`` (or from the
    first commit seen) would end "stalled" at a look; none depends on how fast this machine writes."""
    STEPS, STALL = 4, 10.0
    since = time.time() - 3 * STALL
    looks: list[tuple[str, int | None]] = []
    real_check = checkpoint.check_checkpoint

    def commit_then_look(**kwargs: Any) -> dict[str, Any]:
        step = len(looks) + 1
        store.write(step, {"w": np.full(1, step)})
        marker = store.bucket.get_blob(store.step_prefix(step) + "commit_success.txt")
        outcome = real_check(**kwargs, now=marker.time_created.timestamp() + STALL / 2)
        looks.append((outcome["status"], outcome.get("latest_step", outcome.get("step"))))
        return outcome

    monkeypatch.setattr(checkpoint, "check_checkpoint", commit_then_look)
    events = asyncio.run(_events(_trigger(store, STEPS, stall_timeout=STALL, since=since), timeout=300.0))
    assert [(e["status"], e["step"]) for e in events] == [("success", STEPS)], events
    assert looks == [("waiting", 1), ("waiting", 2), ("waiting", 3), ("success", 4)], looks
