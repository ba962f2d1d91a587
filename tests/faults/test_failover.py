"""When the place is gone (issue 15): the run moves to another zone, or to the other family, and resumes.

Real local cloud and `airflow dags test`. The facts asserted come from outside the code under test: the
local cloud's own event log (where machines were created), the workload's log in GCS (where it resumed),
the machines left in the cloud, and the final weights against an uninterrupted reference run.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from interlude.training import events
from tests.faults.support import Waiting, record_task_states, waiting_in_trigger

from .stage_fixtures import BUCKET, reference, run_dag, store, when_training, workload_log

pytestmark = pytest.mark.e2e

HOME_ZONE, OTHER_ZONE = "us-central1-a", "us-central2-b"
QUOTA_WAIT_TRIGGER = "interlude.triggers.provision.QuotaWaitTrigger"


def _moves(cloud: Any, run_key: str) -> list[dict[str, Any]]:
    """The run's move events, read from this test's GCS emulator (the environment is left as it was)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", cloud.gcs_endpoint)
        return [e for e in events.load_events(BUCKET, run_key) if e.get("kind") == "move"]


def _resumed_steps(log: str) -> list[int]:
    return [int(s) for s in re.findall(r"resume point: step (\d+)", log)]


def test_stockout_where_it_ran_moves_the_run_to_another_zone(stage_stack: Any, tmp_path: Path) -> None:
    cloud, _ = stage_stack

    def mid_training(machine: dict[str, Any], progress: dict[str, Any]) -> bool:
        return machine["zone"] == HOME_ZONE and int(progress.get("step") or 0) >= 20

    def lose_the_place(machine: dict[str, Any]) -> None:
        cloud.admin.set_capacity(HOME_ZONE, "tpu", "v6e-8", on_demand=0, spot=0)
        cloud.admin.preempt("tpu", machine["zone"], machine["name"])

    watcher = when_training(cloud, mid_training, lose_the_place)
    result, run_key = run_dag(stage_stack, tmp_path, spot=True, zones=[HOME_ZONE, OTHER_ZONE], train_steps=300)
    watcher.join(timeout=1)

    assert result.state == "success", result.log[-4000:]
    moves = _moves(cloud, run_key)
    assert [(m["from_zone"], m["to"]) for m in moves] == [(HOME_ZONE, f"v6e-8 in {OTHER_ZONE}")], moves
    booted = [str(e["machine"]) for e in cloud.admin.events() if e.get("event") == "machine_boot"]
    assert booted[0].startswith(f"tpu-{HOME_ZONE}-") and booted[-1].startswith(f"tpu-{OTHER_ZONE}-"), booted
    resumed = _resumed_steps(workload_log(cloud, run_key, "train"))
    assert resumed and max(resumed) >= 20, resumed  # the new zone's machine resumed from the committed step
    assert store(cloud, run_key, "finetune").latest().checkpoint.metrics["digest"] == reference(cloud, train_steps=300)
    assert cloud.admin.machines() == []


def test_all_tpu_capacity_gone_continues_on_gpu_from_the_tpu_checkpoint(stage_stack: Any, tmp_path: Path) -> None:
    cloud, _ = stage_stack

    def mid_training(machine: dict[str, Any], progress: dict[str, Any]) -> bool:
        return machine["kind"] == "tpu" and int(progress.get("step") or 0) >= 20

    def lose_every_tpu(machine: dict[str, Any]) -> None:
        for zone in (HOME_ZONE, OTHER_ZONE):
            for tpu_type in ("v6e-8", "v5litepod-8"):
                cloud.admin.set_capacity(zone, "tpu", tpu_type, on_demand=0, spot=0)
        cloud.admin.preempt("tpu", machine["zone"], machine["name"])

    watcher = when_training(cloud, mid_training, lose_every_tpu)
    result, run_key = run_dag(stage_stack, tmp_path, spot=True, zones=[HOME_ZONE, OTHER_ZONE], train_steps=300)
    watcher.join(timeout=1)

    assert result.state == "success", result.log[-4000:]
    moves = _moves(cloud, run_key)
    assert len(moves) == 1 and moves[0]["cross_family"] is True, moves
    assert moves[0]["to"].startswith("nvidia-"), moves
    booted_kinds = {e["machine"].split("-", 1)[0] for e in cloud.admin.events() if e.get("event") == "machine_boot"}
    assert booted_kinds == {"tpu", "gce"}, booted_kinds
    resumed = _resumed_steps(workload_log(cloud, run_key, "train"))
    assert resumed and max(resumed) >= 20, resumed
    assert store(cloud, run_key, "finetune").latest().checkpoint.metrics["digest"] == reference(cloud, train_steps=300)
    assert cloud.admin.machines() == []


def test_nowhere_to_go_waits_for_capacity_when_the_profile_allows_then_resumes(
    stage_stack: Any,
    tmp_path: Path,
) -> None:
    """A TPU-only model (its profile may wait) loses every TPU mid-training: no move is possible (the other
    family needs a conversion), so the stage waits in the triggerer instead of failing, and resumes from its
    committed checkpoint when capacity comes back. The wait is read from Airflow's own state (the task's state
    changes as the database recorded them, its trigger row), and capacity comes back only once it is seen."""
    cloud, env = stage_stack
    home = Path(env["AIRFLOW_HOME"])
    record_task_states(home)
    seen: list[Waiting] = []
    lost_at = time.monotonic() + 10_000  # not lost yet

    def mid_training(machine: dict[str, Any], progress: dict[str, Any]) -> bool:
        return machine["kind"] == "tpu" and int(progress.get("step") or 0) >= 20

    def lose_every_tpu(machine: dict[str, Any]) -> None:
        nonlocal lost_at
        for zone in (HOME_ZONE, OTHER_ZONE):
            for tpu_type in ("v6e-8", "v5litepod-8"):
                cloud.admin.set_capacity(zone, "tpu", tpu_type, on_demand=0, spot=0)
        cloud.admin.preempt("tpu", machine["zone"], machine["name"])
        lost_at = time.monotonic()

    def capacity_back() -> None:
        """Capacity returns once the stage is seen waiting in its trigger; if it never is, after 300 s anyway,
        so the run ends and the test fails on what it did not see rather than on a timeout."""
        deadline = time.monotonic() + 700
        while time.monotonic() < deadline and time.monotonic() - lost_at < 300:
            waiting = waiting_in_trigger(home, "train")
            if waiting is not None and waiting.next_method == "capacity_waited":
                seen.append(waiting)
                time.sleep(3)
                break
            time.sleep(0.5)
        cloud.admin.set_capacity(HOME_ZONE, "tpu", "v6e-8", on_demand=4, spot=4)

    watcher = when_training(cloud, mid_training, lose_every_tpu)
    restorer = threading.Thread(target=capacity_back, daemon=True)
    restorer.start()
    result, run_key = run_dag(
        stage_stack,
        tmp_path,
        spot=True,
        zones=[HOME_ZONE, OTHER_ZONE],
        model_profile="maxtext-tpu-only",
        train_steps=300,
    )
    watcher.join(timeout=1)
    restorer.join(timeout=1)

    assert result.state == "success", result.log[-4000:]
    assert seen, "train was never seen waiting for capacity in a trigger (Airflow's DB)"
    assert seen[0].classpath == QUOTA_WAIT_TRIGGER and seen[0].running == [], seen
    booted = [str(e["machine"]) for e in cloud.admin.events() if e.get("event") == "machine_boot"]
    assert all(b.startswith("tpu-") for b in booted) and len(set(booted)) >= 1, booted
    resumed = _resumed_steps(workload_log(cloud, run_key, "train"))
    assert resumed and max(resumed) >= 20, resumed  # resumed from what it had committed before the loss
    assert store(cloud, run_key, "finetune").latest().checkpoint.metrics["digest"] == reference(cloud, train_steps=300)
    assert cloud.admin.machines() == []
    print(f"lost every TPU, waited, resumed: {time.monotonic() - lost_at:.0f}s from the loss to the end")
