"""StageTrigger: serializable for the triggerer, and one zone list per interval however many watch."""

from __future__ import annotations

import asyncio
import importlib

from interlude.stage.model import StageState
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


def test_a_watcher_started_after_a_shared_list_was_fetched_gets_a_newer_one() -> None:
    """A deferred stage's new trigger must not read a list fetched before it started (before the worker's
    own last look, which may have seen a notice that list predates); watchers started earlier still share."""
    import time

    cache = ZoneListCache()
    lists = iter(["before-the-notice", "after-it"])

    async def fetch() -> list[dict]:
        return [{"name": "projects/p/locations/z/nodes/n", "state": next(lists)}]

    async def main() -> tuple[str, str, str]:
        first = await cache.get(("tpu", "", "z"), fetch, max_age=10)
        shared = await cache.get(("tpu", "", "z"), fetch, max_age=10, not_before=0.0)
        started = time.monotonic()
        fresh = await cache.get(("tpu", "", "z"), fetch, max_age=10, not_before=started)
        return first["n"]["state"], shared["n"]["state"], fresh["n"]["state"]

    assert asyncio.run(main()) == ("before-the-notice", "before-the-notice", "after-it")
    assert cache.calls == 2


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

    from interlude.stage.machine import next_step
    from interlude.stage.model import Limits, Machine, Observation
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

    from interlude.stage.model import Machine

    return replace(obs, machine=Machine.READY)


def test_a_shared_zone_list_keeps_only_what_the_watchers_read() -> None:
    """Narrowing each machine in the shared list changes no verdict: the same Machine, notice and state,
    whatever the node or VM says (the fields dropped are the bulk of the list: network, metadata, ...)."""
    from interlude.stage.observe import gce_state, machine_view, tpu_state

    bulk = {
        "networkEndpoints": [{"ipAddress": f"10.0.0.{i}", "port": 8470} for i in range(8)],
        "metadata": {"startup-script": "#!/bin/bash\n" + "echo x\n" * 200},
        "labels": {"run": "r"},
        "acceleratorType": "v5litepod-8",
    }
    notice = {"type": "SCHEDULED", "maintenanceStatus": "ONGOING", "windowStartTime": "2026-12-03T10:00:00Z"}
    tpus = [
        {"name": "projects/p/locations/z/nodes/a", "state": "READY", "health": "HEALTHY", **bulk},
        {"name": "projects/p/locations/z/nodes/b", "state": "READY", "upcomingMaintenance": notice, **bulk},
        {"name": "projects/p/locations/z/nodes/c", "state": "READY", "health": "UNHEALTHY_MAINTENANCE", **bulk},
        {"name": "projects/p/locations/z/nodes/d", "state": "PREEMPTED", **bulk},
    ]
    vms = [
        {"name": "e", "status": "RUNNING", "resourceStatus": {"upcomingMaintenance": notice}, **bulk},
        {"name": "f", "status": "TERMINATED", "scheduling": {"provisioningModel": "SPOT"}, **bulk},
        {"name": "g", "status": "TERMINATED", "scheduling": {"automaticRestart": True}, **bulk},
    ]

    async def listed(items: list[dict]) -> dict[str, dict]:
        async def fetch() -> list[dict]:
            return items

        return await ZoneListCache().get(("k", "", "z"), fetch, max_age=10)

    kept = asyncio.run(listed(tpus + vms))
    for item in tpus + vms:
        narrow = kept[item["name"].rsplit("/", 1)[-1]]
        assert not set(bulk) & set(narrow)
        for kind in ("tpu_node", "gce_vm"):
            assert machine_view(kind, narrow) == machine_view(kind, item)
        assert tpu_state(narrow) == tpu_state(item) and gce_state(narrow) == gce_state(item)
