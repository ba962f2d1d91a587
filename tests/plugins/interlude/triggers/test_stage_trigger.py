"""StageTrigger: serializable for the triggerer, and one zone list per interval however many watch."""

from __future__ import annotations

import asyncio
import importlib

from interlude.maintenance import StageState
from interlude.triggers.stage import StageTrigger, ZoneListCache


def test_serialize_round_trips_through_its_dotted_path() -> None:
    trigger = StageTrigger(
        machine={"kind": "tpu_node", "zone": "z", "name": "n"},
        bucket="b",
        run_key="k",
        stage="train",
        state=StageState(target_step=5).to_dict(),
        restart_timeout=30.0,
        poll_interval=2.0,
        stall_timeout=60.0,
        api_outage_budget=120.0,
        gcp_conn_id=None,
    )
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    again = getattr(importlib.import_module(module), name)(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert StageState.from_dict(kwargs["state"]) == StageState(target_step=5)


def test_zone_list_cache_shares_one_call_between_many_watchers() -> None:
    cache = ZoneListCache()
    calls = []

    async def fetch() -> list[dict]:
        calls.append(1)
        await asyncio.sleep(0.05)
        return [{"name": "projects/p/locations/z/nodes/n"}]

    async def main() -> None:
        results = await asyncio.gather(*(cache.get(("tpu", "", "z"), fetch, max_age=10) for _ in range(500)))
        assert all(r == {"n": {"name": "projects/p/locations/z/nodes/n"}} for r in results)
        await cache.get(("tpu", "", "other-zone"), fetch, max_age=10)

    asyncio.run(main())
    assert len(calls) == 2 and cache.calls == 2


def test_on_kill_asks_the_workload_for_a_checkpoint(bucket: str) -> None:
    from interlude_workload.checkpoints import CheckpointStore

    trigger = StageTrigger(
        machine={"kind": "tpu_node", "zone": "z", "name": "n"},
        bucket=bucket,
        run_key="k",
        stage="train",
        state=StageState(target_step=5).to_dict(),
        restart_timeout=30.0,
    )
    asyncio.run(trigger.on_kill())
    (pending,) = CheckpointStore(bucket, "k", "train").pending_requests()
    assert pending.startswith("kill")


def test_events_are_small_and_json_safe_with_a_log_tail_only_on_failure() -> None:
    import json

    from interlude.maintenance import Limits, Machine, Observation, next_step
    from interlude.triggers.stage import transition_event

    obs = Observation(
        now=100.0,
        machine=Machine.UNKNOWN,
        notice=None,
        committed_step=0,
        progress_step=0,
        api_error="TransientError: 503",
    )
    state = StageState(target_step=5, outage_since=0.0)
    failed = next_step(state, obs, Limits(restart_timeout=30.0, api_outage_budget=10.0))
    serial = "\n".join(f"line {i} " + "x" * 200 for i in range(5000))
    payload = transition_event("train", failed, {"step": 3, "total_steps": 5}, serial, obs)
    text = json.dumps(payload)
    assert json.loads(text)["actions"] == ["fail"] and len(text) < 8000
    assert payload["log_tail"].endswith("x" * 50) and payload["progress_line"].startswith("[train] step 3/5")
    calm = next_step(StageState(target_step=5), replace_machine(obs), Limits(restart_timeout=30.0))
    assert "log_tail" not in transition_event("train", calm, {}, serial, obs)


def replace_machine(obs):
    from dataclasses import replace

    from interlude.maintenance import Machine

    return replace(obs, machine=Machine.READY)
