"""A job that checkpoints with plain Orbax, with no Interlude code in it, run by the training DAG (issue 31).

The job (plain_orbax_job.py) is given as ``workload_command``. Interlude watches its Orbax steps, gets a
checkpoint out of it for the drill with the SIGTERM such jobs already handle, rides out the maintenance and starts
it again. What is checked comes from the job's own log (every step it computed, the step it resumed from, its final
digest), the local cloud's own boot count, and the uninterrupted reference computed here from the job's step.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from interlude_dev import wiring as dev

from . import plain_orbax_job
from .stage_fixtures import (  # noqa: F401 - fixtures
    BASE,
    boots,
    held_and_resumed,
    run_dag,
    stage_airflow_db,
    stage_scenario,
    stage_stack,
    workload_log,
)

pytestmark = pytest.mark.e2e

JOB = Path(plain_orbax_job.__file__)
COMMAND = [
    sys.executable,
    str(JOB),
    "--checkpoint-dir={checkpoint_dir}",
    "--init-from={init_from_dir}",
    "--steps",
    "{steps}",
    "--checkpoint-every",
    "{checkpoint_every}",
    "--seed",
    "{seed}",
    "--step-seconds",
    "0.1",
]


def _reference_digest() -> str:
    """The job's weights after train and fine-tune with no interruption (fine-tune starts from train's last)."""
    w = plain_orbax_job.initial(BASE["seed"])
    for step in range(1, BASE["train_steps"] + 1):
        w = plain_orbax_job.advance(w, step)
    for step in range(1, BASE["finetune_steps"] + 1):
        w = plain_orbax_job.advance(w, step)
    return plain_orbax_job.digest(w)


def test_a_plain_orbax_job_is_drilled_and_resumes_with_no_step_computed_twice(stage_stack, tmp_path: Path) -> None:  # noqa: F811
    cloud, _ = stage_stack
    result, run_key = run_dag(stage_stack, tmp_path, drill_maintenance=True, workload_command=COMMAND)
    assert result.succeeded, result.log[-4000:]
    report = dev.read_report(cloud, "interlude-faults", run_key)
    assert report is not None
    for stage, steps in (("train", BASE["train_steps"]), ("finetune", BASE["finetune_steps"])):
        log = workload_log(cloud, run_key, stage)
        _check_no_committed_work_redone(stage, steps, log)
        held, resumed = held_and_resumed(log)
        restored = [int(s) for s in re.findall(r"restored step (\d+)", log)]
        assert len(held) == 1 and held[0] in restored, (held, restored)  # the job itself restored the held step
        assert held[0] >= min(BASE["checkpoint_every"], steps - 1) and held[0] in resumed
        (event,) = [e for e in report["events"] if e["stage"] == stage]
        assert event["drill"] is True and event["checkpoint_step"] == held[0], event
        assert event["steps_recomputed"] == 0 and event["downtime_s"] > 0, event
    finetune_log = workload_log(cloud, run_key, "finetune")
    assert f"initialised from gs://interlude-faults/interlude/{run_key}/train/checkpoints step 60" in finetune_log
    (final,) = re.findall(r"final digest ([0-9a-f]{64})", finetune_log)
    assert final == _reference_digest()
    assert boots(cloud, f"{run_key}-tpu") == 3, "one boot, then one per drill"
    assert dev.machines(cloud) == []
    assert _job_processes(run_key) == [], "the job outlived its machine"


def _check_no_committed_work_redone(stage: str, steps: int, log: str) -> None:
    """Every step computed; each start of the job steps on right after the step it resumed from; and a step is
    computed twice only after the job itself crashed (an exit Interlude did not ask for, e.g. an Orbax save of the
    job's own that failed: what it had not saved is lost, as on Google), never after a hold or a maintenance."""
    computed: list[int] = []
    crashed = False
    allowed: set[int] = set()  # steps a crash lost (computed after the resume point, not saved)
    expect_next: int | None = None
    for line in log.splitlines():
        if m := re.search(r"computed step (\d+)", line):
            step = int(m.group(1))
            assert expect_next is None or step == expect_next, f"{stage}: resumed at {step}, not {expect_next}"
            expect_next = None
            assert step not in computed or step in allowed, f"{stage}: step {step} computed twice\n{log[-3000:]}"
            computed.append(step)
        elif m := re.search(r"resume point: step (\d+)", line):
            resumed = int(m.group(1))
            expect_next = resumed + 1
            allowed = set(range(resumed + 1, max(computed, default=0) + 1)) if crashed else set()
            crashed = False
        elif m := re.search(r"job exited (-?\d+)", line):
            crashed = int(m.group(1)) not in (0, 143, -15)
    assert sorted(set(computed)) == list(range(1, steps + 1)), f"{stage}: a step never computed\n{log[-3000:]}"


def _job_processes(run_key: str) -> list[str]:
    """Processes still running this run's job (their command lines, from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(JOB) in cmdline and run_key in cmdline:
            found.append(cmdline)
    return found
