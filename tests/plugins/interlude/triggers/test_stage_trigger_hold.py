"""The short phase before a maintenance window: a StageTrigger that waits for the workload's hold sees it with
one GET of progress.json per look (no bucket listing, no re-verifying downloads), and starts the maintenance.
A real TPU node of the local cloud with a real SCHEDULED notice; the workload's side written as the SDK does."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import requests

from interlude.stage.facts import with_progress
from interlude.stage.model import Phase, StageState
from interlude.stage.notice_wait import policy_for
from interlude.stage.observe import StageFacts
from interlude.triggers import stage as stage_mod
from interlude.triggers.stage import StageTrigger
from interlude_workload.checkpoints import CheckpointStore

ZONE = "us-central1-a"
NODE = "held-at-commit"


@pytest.fixture(scope="module")
def cloud() -> Iterator[Any]:
    from interlude_localcloud.testing import running_localcloud

    with running_localcloud("benchmark", strict=True, gcs=False) as lc:
        yield lc


def _ready_node(cloud: Any) -> dict[str, Any]:
    url = f"{cloud.api_endpoint}/v2/projects/{cloud.project}/locations/{ZONE}/nodes"
    body = {"acceleratorType": "v5litepod-8", "runtimeVersion": "v2-alpha-tpuv5-lite"}
    requests.post(url, params={"nodeId": NODE}, json=body, timeout=30).raise_for_status()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        node = requests.get(f"{url}/{NODE}", timeout=30).json()
        if node.get("state") == "READY":
            return node
        time.sleep(0.1)
    raise AssertionError("node not READY")


def test_with_progress_counts_the_held_step_as_committed_only_while_holding() -> None:
    facts = StageFacts(committed_step=96, progress={"step": 99, "state": "running"}, request_ack_step=96)
    held = with_progress(facts, {"step": 104, "state": "holding", "held_at": 104})
    assert (held.committed_step, held.progress["step"], held.request_ack_step) == (104, 104, 96)
    assert with_progress(facts, {"step": 104, "state": "running", "held_at": 104}).committed_step == 96
    assert with_progress(facts, {"step": 104, "state": "holding", "held_at": True}).committed_step == 96
    assert with_progress(facts, {"step": 104, "state": "holding", "held_at": 90}).committed_step == 96
    assert with_progress(facts, None) == facts  # unreadable: nothing new is known


def test_the_hold_before_the_window_is_seen_without_listing_the_bucket_and_starts_the_maintenance(
    cloud: Any, bucket: str, anonymous_connection: None
) -> None:
    node = _ready_node(cloud)
    # Ten real minutes ahead at the scenario's 3600x; the policy reads the clock at 1x, so the window is "near"
    # (within 15 minutes) for the whole test, and Google allows an early start (SCHEDULED: canReschedule).
    cloud.admin.maintenance("tpu", ZONE, NODE, "SCHEDULED", 600.0 * 3600)
    store = CheckpointStore(bucket, NODE, "train")
    store.write(96, {"w": np.frombuffer(b"\1" * 16, np.uint8)})  # our checkpoint, answering request r1
    store.acknowledge("r1", 96)
    store.write_progress({"step": 99, "total_steps": 1000, "state": "running", "boot_id": "b", "commit_seconds": 0.05})
    machine = {"kind": "tpu_node", "zone": ZONE, "name": NODE, "accelerator_type": node["acceleratorType"]}
    policy = policy_for(machine, "by_notice", time_scale=1.0, poll_seconds=0.5)
    assert policy is not None
    event = {"event_id": "e1", "kind": "maintenance", "checkpoint_step": 96, "down_at": None, "detected_at": 0.0}
    state = StageState(
        target_step=1000, phase=Phase.AWAITING_RESTART, request_id="r1", event=event, last_step_seen=99, boot_id="b"
    )
    trigger = StageTrigger(
        machine=machine,
        bucket=bucket,
        run_key=NODE,
        stage="train",
        state=state.to_dict(),
        restart_timeout=3600.0,
        poll_interval=0.5,
        notice_policy=policy.to_dict(),
    )

    async def main() -> tuple[dict[str, Any], int, float]:
        events = trigger.run()
        first = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(1.5)  # a few polls' worth of quick looks while it trains on: nothing to do yet
        assert not first.done(), first.result().payload
        lists = stage_mod.BUCKET_LISTS.calls
        # The workload commits step 104 and holds there (Checkpointer.wait_while_held: commit, then the hold).
        await asyncio.to_thread(store.write, 104, {"w": np.frombuffer(b"\2" * 16, np.uint8)})
        held = {"step": 104, "total_steps": 1000, "state": "holding", "held_at": 104, "boot_id": "b"}
        await asyncio.to_thread(store.write_progress, {**held, "commit_seconds": 0.05})
        held_at = time.monotonic()
        payload = (await asyncio.wait_for(first, timeout=60)).payload
        await events.aclose()
        return payload, stage_mod.BUCKET_LISTS.calls - lists, time.monotonic() - held_at

    payload, lists_after_hold, _seen_in = asyncio.run(main())
    assert payload["status"] == "transition" and payload["actions"] == ["start_maintenance"], payload
    assert payload["state"]["event"]["early_start_at"] is not None
    # Seen by progress.json alone: not one listing of the bucket between the hold and the event.
    assert lists_after_hold == 0
