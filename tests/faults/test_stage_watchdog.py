"""A stage never hangs on a paid machine and never fails on a control-plane blip (issue 10.6, 10.7).

Real pieces only: the local cloud (its admin API injects the API errors and tells how often it booted
the machine), the machine's own processes (killed from outside, as a crashed agent would leave a READY
machine), and `airflow dags test`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from interlude_dev import wiring as dev

from .stage_fixtures import boots, final_digest, reference, run_dag, when_training, workload_log

pytestmark = pytest.mark.e2e
LIST_NODES = r"^/v2/projects/[^/]+/locations/[^/]+/nodes$"


def test_api_outage_longer_than_the_hooks_retries_is_ridden_out(stage_stack, tmp_path: Path) -> None:
    """40 answers of 503 to the trigger's list call: well past one call's 7 retries (about a minute)."""
    cloud, _ = stage_stack
    faults = 40

    def outage(_: dict[str, Any]) -> None:
        cloud.admin.inject_fault(LIST_NODES, status=503, count=faults, method="GET")

    watcher = when_training(cloud, lambda m, p: int(p.get("step") or 0) >= 20, outage)
    result, run_key = run_dag(stage_stack, tmp_path, train_steps=300)
    watcher.join(timeout=5)
    assert result.succeeded, result.log[-4000:]
    injected = [e for e in cloud.admin.events() if e["event"] == "fault_injected"]
    assert len(injected) == faults, "the whole outage happened"
    assert boots(cloud, f"{run_key}-tpu") == 1, "the workload rode it out on its first boot"
    assert "new boot" not in workload_log(cloud, run_key, "train")
    assert final_digest(cloud, run_key) == reference(cloud, train_steps=300)
    assert dev.machines(cloud) == []


def test_a_stalled_workload_is_restarted_once_then_the_stage_fails_with_the_log_tail(
    stage_stack,
    tmp_path: Path,
) -> None:
    """The agent dies and the machine stays READY (nothing left to run the stage): no progress for
    stall_timeout_seconds -> the workload is restarted (stop/start); when it dies again -> the stage fails."""
    cloud, _ = stage_stack
    killed: list[str] = []  # boot ids whose processes were killed
    seen: list[str] = []

    def kill(m: dict[str, Any]) -> None:
        os.killpg(int(m["pid"]), signal.SIGKILL)  # the guest's processes only; the cloud still says READY
        killed.append(seen[-1])

    def alive_after(count: int) -> Any:
        def ready(m: dict[str, Any], progress: dict[str, Any]) -> bool:
            boot, step = str(progress.get("boot_id")), int(progress.get("step") or 0)
            if (
                m.get("pid")
                and len(killed) == count
                and boot not in killed
                and step >= 15
                and step > int(progress.get("resumed_from") or 0)
            ):
                seen.append(boot)
                return True
            return False

        return ready

    first = when_training(cloud, alive_after(0), kill)
    started = time.monotonic()
    second = when_training(cloud, alive_after(1), kill, timeout=600)
    result, run_key = run_dag(stage_stack, tmp_path, train_steps=2000, stall_timeout_seconds=30, timeout=400)
    first.join(timeout=5)
    second.join(timeout=5)
    assert len(killed) == 2, killed
    assert result.state == "failed"
    assert "no progress for" in result.log and "after restarting the workload once" in result.log
    assert "workload log tail" in result.log, "the failure carries the machine's last words"
    assert boots(cloud, f"{run_key}-tpu") == 2, "restarted exactly once"
    assert dev.machines(cloud) == [], "teardown deletes the machine"
    print(f"stalled twice and failed in {time.monotonic() - started:.0f}s")


def _kill_workload(pgid: int) -> int:
    """SIGKILL the agent and trainer of a machine, leaving its startup script to notice and end."""
    killed = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().split("(", 1)[1].rsplit(")", 1)
            fields = rest.split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        # an interpreter's command line names the module; a fork of the local cloud's fork server is named for it
        workload = b"interlude_workload" in cmdline or comm in ("il-agent", "il-train")
        if int(fields[2]) == pgid and workload:
            os.kill(int(stat.parent.name), signal.SIGKILL)
            killed += 1
    return killed


@pytest.mark.parametrize(
    ("profile", "where"),
    [
        ("cuda-kernels-gpu-only", "serial console tail"),  # a GPU VM: its serial console
        ("maxtext-tpu-only", "guest attributes (interlude/startup) tail"),  # a TPU node: getGuestAttributes
    ],
)
def test_a_startup_script_that_ended_is_seen_restarted_once_then_fails(
    stage_stack,
    tmp_path: Path,
    profile: str,
    where: str,
) -> None:
    """The agent dies and the startup script ends (a GPU VM's serial console, a TPU node's guest attributes):
    acted on long before the stall timeout (left at its default of 10 minutes): one restart, then the stage
    fails with the machine's last words."""
    cloud, _ = stage_stack
    killed: list[str] = []
    seen: list[str] = []

    def kill(m: dict[str, Any]) -> None:
        assert _kill_workload(int(m["pid"])) >= 1
        killed.append(seen[-1])

    def alive_after(count: int) -> Any:
        def ready(m: dict[str, Any], progress: dict[str, Any]) -> bool:
            boot, step = str(progress.get("boot_id")), int(progress.get("step") or 0)
            if (
                m.get("pid")
                and len(killed) == count
                and boot not in killed
                and step >= 15
                and step > int(progress.get("resumed_from") or 0)
            ):
                seen.append(boot)
                return True
            return False

        return ready

    first = when_training(cloud, alive_after(0), kill)
    second = when_training(cloud, alive_after(1), kill, timeout=600)
    started = time.monotonic()
    result, run_key = run_dag(stage_stack, tmp_path, model_profile=profile, train_steps=2000, timeout=500)
    first.join(timeout=5)
    second.join(timeout=5)
    assert len(killed) == 2, killed
    assert result.state == "failed"
    assert "startup script ended: exit 137" in result.log and "after restarting the workload once" in result.log
    assert where in result.log and "startup: end (exit 137)" in result.log.split(where, 1)[1]
    booted = sum(1 for e in cloud.admin.events() if e["event"] == "machine_boot")
    assert booted == 2, "restarted exactly once"
    assert dev.machines(cloud) == [], "teardown deletes the machine"
    print(f"failed {time.monotonic() - started:.0f}s after the run started")
