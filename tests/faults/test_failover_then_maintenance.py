"""Scheduled maintenance, then a failover, then scheduled maintenance again on the machine the run moved to.

The design the Interlude view's screenshots are taken of (issue 36: two maintenance events and one failover), run on
the real local cloud with `airflow dags test`: a SCHEDULED host maintenance (Google's notice) in `train` on the first
machine, its zone's capacity gone and the spot machine preempted (the run moves to the other zone), then a SCHEDULED
maintenance in `finetune` on the moved machine. Judged by the workload's own log (where each boot resumed), the
local cloud's own event log (where machines booted) and the final weights against an uninterrupted run.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from interlude_dev import wiring as dev

from .stage_fixtures import BUCKET, reference, run_dag, store, workload_log

pytestmark = pytest.mark.e2e

HOME_ZONE, OTHER_ZONE = "us-central1-a", "us-central2-b"
TRAIN_STEPS, FINETUNE_STEPS = 120, 120  # the finetune notice (4 s) comes and goes before its end


def _progress(cloud: dev.LocalCloud, machine: dict[str, Any], stage: str) -> dict[str, Any]:
    return dict(store(cloud, machine["name"].rsplit("-", 1)[0], stage).read_progress() or {})


def _act_once(cloud: dev.LocalCloud, done: list[str], m: dict[str, Any], failover_in: str, old_boots: set[str]) -> None:
    """The next act of the design on machine `m`, when it is due (see `_acts`)."""
    if m["kind"] != "tpu" or m.get("state") != "READY":
        return
    if not done and m["zone"] == HOME_ZONE and int(_progress(cloud, m, "train").get("step") or 0) >= 15:
        cloud.admin.maintenance("tpu", m["zone"], m["name"], type="SCHEDULED")
        done.append(f"maintenance train {m['name']}")
    elif len(done) == 1 and m["zone"] == HOME_ZONE and _due(_progress(cloud, m, failover_in), failover_in):
        for tpu_type in ("v6e-8", "v5litepod-8"):
            cloud.admin.set_capacity(HOME_ZONE, "tpu", tpu_type, on_demand=0, spot=0)
        old_boots.add(str(_progress(cloud, m, "finetune").get("boot_id")))  # none yet when it fails over in train
        cloud.admin.preempt("tpu", m["zone"], m["name"])
        done.append(f"preempted {m['name']} in {failover_in}")
    elif len(done) == 2 and m["zone"] == OTHER_ZONE and _on_a_new_boot(_progress(cloud, m, "finetune"), old_boots):
        cloud.admin.maintenance("tpu", m["zone"], m["name"], type="SCHEDULED")
        done.append(f"maintenance finetune {m['name']}")


def _due(progress: dict[str, Any], stage: str) -> bool:
    """The failover's moment: 10 steps into `stage` (into train's boot after the maintenance, for train)."""
    return (stage != "train" or bool(progress.get("resumed_from"))) and _past_a_resume(progress, 10)


def _on_a_new_boot(progress: dict[str, Any], old_boots: set[str]) -> bool:
    """finetune stepped 10 past its resume point on the moved machine's boot (not on a boot from before the move:
    its progress.json is the old boot's until the new one writes its own)."""
    return str(progress.get("boot_id")) not in old_boots and _past_a_resume(progress, 10)


def _past_a_resume(progress: dict[str, Any], steps: int) -> bool:
    """The stage stepped `steps` past where its boot resumed (its start, on a first boot)."""
    return int(progress.get("step") or 0) >= int(progress.get("resumed_from") or 0) + steps


def _acts(cloud: dev.LocalCloud, done: list[str], failover_in: str, timeout: float = 500) -> threading.Thread:
    """In the background, in order: a scheduled maintenance in train (step >= 15, first zone); the first zone's
    capacity gone and the machine preempted in `failover_in` (10 steps after its boot resumed); a scheduled
    maintenance in finetune on the machine in the other zone (10 steps after its boot resumed)."""

    def loop() -> None:
        deadline = time.monotonic() + timeout
        old_boots: set[str] = set()
        while time.monotonic() < deadline and len(done) < 3:
            for m in cloud.admin.machines():
                _act_once(cloud, done, m, failover_in, old_boots)
            time.sleep(0.3)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


# The failover in fine-tuning only (issue 44: one real run per promise, not per variant): a move in training, and
# the resume from the train stage's checkpoint on the new machine, are tests/faults/test_failover.py's three runs;
# here the moved machine must resume the fine-tuning (its own stage's checkpoint) and be maintained again.
@pytest.mark.parametrize("failover_in", ["finetune"])
def test_scheduled_maintenance_failover_then_maintenance_on_the_moved_machine_finishes_with_the_reference(
    stage_stack: Any,
    tmp_path: Path,
    failover_in: str,
) -> None:
    cloud, _ = stage_stack
    done: list[str] = []
    actor = _acts(cloud, done, failover_in)
    conf = {"spot": True, "zones": [HOME_ZONE, OTHER_ZONE], "train_steps": TRAIN_STEPS}
    conf["finetune_steps"] = FINETUNE_STEPS
    result, run_key = run_dag(stage_stack, tmp_path, timeout=900, **conf)
    actor.join(timeout=5)
    finetune_log = workload_log(cloud, run_key, "finetune")
    assert len(done) == 3, (done, result.log[-3000:])
    assert result.succeeded, f"{result.states}\n{result.log[-6000:]}\nfinetune workload log:\n{finetune_log[-4000:]}"
    report = dev.read_report(cloud, BUCKET, run_key)
    assert report is not None
    kinds = [(e["stage"], e["kind"]) for e in report["events"]]
    assert kinds.count(("train", "maintenance")) == 1 and kinds.count(("finetune", "maintenance")) == 1, kinds
    moves = [e for e in report["events"] if e["kind"] == "move"]
    assert [(m["from_zone"], m["to"].rsplit(" in ", 1)[1]) for m in moves] == [(HOME_ZONE, OTHER_ZONE)], moves
    booted = [str(e["machine"]) for e in cloud.admin.events() if e.get("event") == "machine_boot"]
    assert booted[0].startswith(f"tpu-{HOME_ZONE}-") and booted[-1].startswith(f"tpu-{OTHER_ZONE}-"), booted
    resumed = [int(s) for s in re.findall(r"resume point: step (\d+)", finetune_log)]
    assert resumed and max(resumed) >= 10, finetune_log[-3000:]  # the moved machine's new boot resumed the finetune
    conf_ref = {"train_steps": TRAIN_STEPS, "finetune_steps": FINETUNE_STEPS}
    assert store(cloud, run_key, "finetune").latest().checkpoint.metrics["digest"] == reference(cloud, **conf_ref)
    assert cloud.admin.machines() == []
