"""A job that checkpoints with plain Orbax, with no Interlude code in it, run by the training DAG (issue 31).

The job (plain_orbax_job.py) is given as ``workload_command``. Interlude watches its Orbax steps, gets a
checkpoint out of it for the drill with the SIGTERM such jobs already handle, rides out the maintenance and starts
it again. What is checked comes from the job's own log (every step it computed, the step it resumed from, its final
digest), the local cloud's own boot count, and the uninterrupted reference computed here from the job's step.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from interlude_dev import wiring as dev

from . import plain_orbax_job
from .stage_fixtures import BASE, boots, held_and_resumed, run_dag, workload_log

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


def test_a_plain_orbax_job_is_drilled_and_resumes_with_no_step_computed_twice(stage_stack, tmp_path: Path) -> None:
    cloud, _ = stage_stack
    result, run_key = run_dag(stage_stack, tmp_path, drill_maintenance=True, workload_command=COMMAND)
    assert result.succeeded, result.log[-4000:]
    report = dev.read_report(cloud, "interlude-faults", run_key)
    assert report is not None
    recomputed_in_run = 0
    for stage, steps in (("train", BASE["train_steps"]), ("finetune", BASE["finetune_steps"])):
        log = workload_log(cloud, run_key, stage)
        runs = _job_runs(stage, steps, log)
        held, resumed = held_and_resumed(log)
        restored = [int(s) for s in re.findall(r"restored step (\d+)", log)]
        # The job's own words: it stopped on SIGTERM once, at the step held, and restored that step itself.
        assert runs.sigterm_stops == held and len(held) == 1 and held[0] in restored, (
            runs.sigterm_stops,
            held,
            restored,
        )
        assert held[0] >= min(BASE["checkpoint_every"], steps - 1) and held[0] in resumed
        stage_events = [e for e in report["events"] if e["stage"] == stage]
        (event,) = [e for e in stage_events if e.get("drill")]
        assert event["checkpoint_step"] == held[0] and event["downtime_s"] > 0, event
        recomputed = sum(int(e["steps_recomputed"] or 0) for e in stage_events)
        assert recomputed == runs.recomputed, (
            f"{stage}: the report says {recomputed} step(s) recomputed, the job's log {runs.recomputed}",
            stage_events,
        )
        recomputed_in_run += runs.recomputed
    assert report["steps_recomputed"] == recomputed_in_run, report
    finetune_log = workload_log(cloud, run_key, "finetune")
    assert f"initialised from gs://interlude-faults/interlude/{run_key}/train/checkpoints step 60" in finetune_log
    (final,) = re.findall(r"final digest ([0-9a-f]{64})", finetune_log)
    assert final == _reference_digest()
    assert boots(cloud, f"{run_key}-tpu") == 3, "one boot, then one per drill"
    assert dev.machines(cloud) == []
    assert _job_processes(run_key) == [], "the job outlived its machine"


AGENT = " interlude-job: "  # a line of the agent's (UserJob's); every other line of the log is the job's own output


@dataclass
class JobRuns:
    """What a stage's log says of the job's starts: every step computed (in order), the steps it says it stopped at
    on SIGTERM, and how often it crashed on its own."""

    computed: list[int] = field(default_factory=list)
    sigterm_stops: list[int] = field(default_factory=list)
    crashes: int = 0

    @property
    def recomputed(self) -> int:
        """Computations of a step already computed, as the job's log shows them."""
        return len(self.computed) - len(set(self.computed))


@dataclass
class _Start:
    """One start of the job, in its own words: the steps it computed, its last save, its SIGTERM stop, a traceback."""

    resumed: int
    computed: list[int] = field(default_factory=list)
    saved: int = 0
    stop: tuple[int, int] | None = None  # (step it stopped after, latest step saved), as it says
    traceback_after: int | None = None  # the last step it had computed when its log shows a traceback
    lines: list[str] = field(default_factory=list)  # its own output


def _job_runs(stage: str, steps: int, log: str) -> JobRuns:
    """Each start of the job, read from its own lines and the agent's record of its exit code (never from what
    Interlude says it did). Every step is computed; each start steps on right after the step it resumed from; and
    each start that ended with an exit code other than 0 ended in one of two ways the job itself tells:

    * it stopped on SIGTERM (a checkpoint asked for, or the machine going down): its log says ``stopped on SIGTERM
      after step N, latest saved step N`` for the last step it computed, and it exited 143. Nothing is lost.
    * it crashed on its own: its log shows its traceback after the last step it computed (whatever its exit code:
      a SIGTERM may still reach it while it exits), e.g. an Orbax save of the job's that failed. What it had not
      saved is lost (as on Google), so the steps after its last save may be computed again, and only then.

    A SIGTERM the job could not handle (its handler not yet set, or its interpreter shutting down after its last
    step: exit -15 or 143 with no stop in its log) passes only when its last computed step was saved.

    Any other end (e.g. SIGKILL: exit -9 with neither in its log) fails here."""
    out = JobRuns()
    allowed: set[int] = set()  # steps a crash of the job's own lost (computed after its last save)
    lost: set[int] = set()
    expect_next: int | None = None
    start = _Start(resumed=0)
    for line in log.splitlines():
        if AGENT not in line:
            start.lines.append(line)
        if AGENT in line:
            if m := re.search(r"resume point: step (\d+)", line):
                start = _Start(resumed=int(m.group(1)), saved=int(m.group(1)))
                expect_next = start.resumed + 1
                allowed, lost = {s for s in lost if s > start.resumed}, set()
            elif m := re.search(r"job exited (-?\d+)", line):
                lost = _judge_exit(stage, int(m.group(1)), start, out)
        elif m := re.search(r"computed step (\d+)", line):
            step = int(m.group(1))
            assert expect_next is None or step == expect_next, f"{stage}: resumed at {step}, not {expect_next}"
            expect_next = None
            assert step not in out.computed or step in allowed, f"{stage}: step {step} computed twice\n{log[-3000:]}"
            out.computed.append(step)
            start.computed.append(step)
        elif m := re.search(r"stopped on SIGTERM after step (\d+), latest saved step (\d+)", line):
            start.stop = (int(m.group(1)), int(m.group(2)))
        elif m := re.search(r"saved step (\d+)", line):
            start.saved = int(m.group(1))
        elif line.startswith("Traceback (most recent call last)"):
            start.traceback_after = start.computed[-1] if start.computed else start.resumed
    assert sorted(set(out.computed)) == list(range(1, steps + 1)), f"{stage}: a step never computed\n{log[-3000:]}"
    return out


def _judge_exit(stage: str, rc: int, start: _Start, out: JobRuns) -> set[int]:
    """How a start of the job ended, from its own log and its exit code; the steps it lost (only by a crash)."""
    last = start.computed[-1] if start.computed else start.resumed
    said = f"{stage}: the job exited {rc} having computed up to step {last}, saved step {start.saved}"
    if rc == 0:
        return set()
    if start.stop is not None:
        assert rc == 143 and start.stop == (last, last), f"{said}, after its SIGTERM stop {start.stop}"
        out.sigterm_stops.append(last)
        return set()
    if start.traceback_after is not None and start.traceback_after == last:  # it stepped no further after it
        out.crashes += 1
        return {s for s in start.computed if s > start.saved}
    if rc in (143, -15) and last == start.saved:
        # A SIGTERM it could not answer in its log: before its handler was set or while it exited (seen: the
        # machine torn down after its final step, during its interpreter's shutdown: -15). It had lost nothing.
        return set()
    raise AssertionError(
        f"{said}, and its log shows neither a stop on SIGTERM nor a crash of its own: it was stopped without "
        f"being asked for a checkpoint; its own output since it started:\n" + "\n".join(start.lines[-40:])
    )


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
