"""A GPU training run that gets an hour's maintenance notice mid-training, and what it cost, read from the
workload's own log (every line stamped by the workload) and the local cloud's own event log.

Shared by tests/faults/test_notice_policy.py, tests/faults/test_down_budget.py and benchmarks/notice_policy.py:
the same run, once with ``maintenance_policy=by_notice`` and once with ``checkpoint_at_notice`` (the old
behaviour). Tooling, so here beside the other run helpers (interlude_dev.wiring), where a benchmark may import
it without reaching into the test tree.

Two readings of a run. :func:`figures` gives seconds on the workload's clock (what the benchmark prints: they
move with the machine's load). :func:`notice_facts` gives what happened and in which order (steps, commits,
the hold, who opened the window), for verdicts that no machine's speed changes; with ``held=True`` the run's
windows are held (the local cloud opens them when the product calls performMaintenance, when the test says, or
at their latest start), so a slow control plane or commit cannot make a window arrive first.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from interlude import naming
from interlude_dev import scenario
from interlude_dev import wiring as dev

DAG_ID = "interlude_training"
STEP_SECONDS = 0.1
NOTICE_AT_STEP = 20
# At 600x an hour's notice (Google's for GPU VMs) is 6 s and the 5-minute host maintenance 0.5 s.
TIME_SCALE = 600
GPU_NOTICE_S = 3600
CONF: dict[str, Any] = {
    "train_steps": 150,
    "finetune_steps": 20,
    "checkpoint_every": 50,
    "step_seconds": STEP_SECONDS,
    "seed": 7,
    "data_date": "2024-01-15",
    "poll_seconds": 0.5,
    "model_profile": "cuda-kernels-gpu-only",
    "model_size": "tiny",  # the reference model cut to one narrow layer: many trainers share 2 cores
}


def write_scenario(path: Path, gpu_maintenance_s: float = 300, time_scale: float = TIME_SCALE) -> Path:
    """The default scenario (at 600x unless told) with an hour's GPU notice and a GPU host maintenance this long."""
    gce = {"scheduled_notice": GPU_NOTICE_S, "duration": gpu_maintenance_s}
    return scenario.build(path, "default", {"time_scale": time_scale, "maintenance": {"gce": gce}})


@dataclass(frozen=True)
class NoticeFigures:
    """One maintenance in a stage, in the workload's own words (seconds on its clock)."""

    notice_step: int  # the step the workload was at when the notice reached it
    trained_after_notice_s: float  # from the notice to the moment it stopped stepping
    stopped_step: int  # the committed step it stopped at (held at, or committed on SIGTERM)
    window_at: float  # the local cloud's own record of the maintenance starting
    last_commit_before_window: int  # the latest step committed before that
    committed_before_window_s: float  # how long before the window that commit landed
    resume_step: int  # where the new boot resumed
    recomputed_steps: int  # steps the old boot reached that the new one had to do again
    idle_s: float  # stopped stepping -> stepping again on the new boot (held, down, booting)
    lost_s: float  # idle plus the time of the recomputed steps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def line_time(line: str) -> float:
    """The workload's stamp at the start of one of its log lines (``2024-01-15T10:00:00.123Z ...``), in epoch
    seconds: the clock the figures are read on."""
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def _first(lines: list[str], pattern: str, after: float = 0.0) -> tuple[float, re.Match[str]] | None:
    for line in lines:
        match = re.search(pattern, line)
        if match and line_time(line) >= after:
            return line_time(line), match
    return None


def figures(log: str, window_at: float) -> NoticeFigures:
    """Read one maintenance from a stage's workload log (all boots, oldest first)."""
    lines = [ln for ln in log.splitlines() if re.match(r"\d{4}-\d\d-\d\dT", ln)]
    notice = _first(lines, r"metadata notice: maintenance-event=TERMINATE")
    assert notice, "the workload never saw the notice"
    notice_at = notice[0]
    commit = _first(lines, r"notice-to-commit \S+ \(step (\d+)\)", notice_at)
    assert commit, "the workload never committed after the notice"
    stops = [
        s
        for s in (
            _first(lines, r"holding at committed step (\d+)", notice_at),
            _first(lines, r"SIGTERM received", notice_at),
        )
        if s
    ]
    assert stops, "the workload neither held nor was stopped"
    stopped_at = min(s[0] for s in stops)
    resumed = _first(lines, r"resume point: step (\d+)", stopped_at)  # the new boot's first words
    assert resumed, "no new boot resumed after the maintenance"
    training = _first(lines, r"training \S+ steps (\d+)\.\.", resumed[0])
    assert training, "the new boot did not train"
    old_boot = [ln for ln in lines if notice_at <= line_time(ln) < resumed[0]]
    reached = max((int(m[1]) for ln in old_boot if (m := re.search(r"\] step (\d+)/", ln))), default=0)
    commits = [
        (line_time(ln), int(m[1]))
        for ln in lines
        if (m := re.search(r"checkpoint step (\d+) committed", ln)) and line_time(ln) < window_at
    ]
    last_at, last_step = max(commits)
    stopped_step = max(
        (int(m[1]) for ln in old_boot if (m := re.search(r"checkpoint step (\d+) committed", ln))), default=0
    )
    resume_step = int(resumed[1][1])
    recomputed = max(0, reached - resume_step)
    idle = training[0] - stopped_at
    return NoticeFigures(
        notice_step=int(commit[1][1]),
        trained_after_notice_s=round(stopped_at - notice_at, 3),
        stopped_step=stopped_step,
        window_at=window_at,
        last_commit_before_window=last_step,
        committed_before_window_s=round(window_at - last_at, 3),
        resume_step=resume_step,
        recomputed_steps=recomputed,
        idle_s=round(idle, 3),
        lost_s=round(idle + recomputed * STEP_SECONDS, 3),
    )


@dataclass(frozen=True)
class NoticeFacts:
    """A stage's first maintenance as facts in their order: the workload's own log (the boot that got the notice,
    from the notice to its last words, and the boot after it) and the local cloud's own event log (the window it
    announced, whether performMaintenance reached it, what opened the window). No duration: times are only read
    to order two events (the workload stamps its lines with the same wall clock the cloud logs with)."""

    notice_at: float  # the notice reached the workload (its first "metadata notice" line)
    notice_step: int  # the step it committed for the notice ("notice-to-commit ... (step N)")
    steps: tuple[int, ...]  # steps that boot logged after the notice (every tenth, and each commit's), in order
    commits: tuple[tuple[float, int, str], ...]  # that boot's commits after the notice: (line time, step, reason)
    control_answers: tuple[int, ...]  # steps it answered the control plane's checkpoint requests with
    held_at: int | None  # the committed step it held at ("holding at committed step S"), None: never held
    held_since: float | None  # when that hold began
    last_reported_step: int  # the old boot's last reported step, in the new boot's words
    resume_step: int  # where the new boot resumed ("resume point: step R")
    first_new_step: int  # the first step the new boot trained ("training <stage> steps N..")
    window_start: float  # windowStartTime as the cloud announced it (its maintenance_notice event)
    performed_at: float | None  # performMaintenance reached the cloud for this VM before the window opened
    opened_at: float  # the cloud opened the window (its maintenance_start)
    opened_by: str  # what opened it: performMaintenance | released (the test) | latest_start | window_start

    @property
    def reached(self) -> int:
        """The furthest step the notice's boot got to."""
        return max((*self.steps, self.last_reported_step, self.notice_step))

    @property
    def recomputed_steps(self) -> int:
        return max(0, self.reached - self.resume_step)

    def committed_before(self, t: float) -> list[int]:
        """Steps that boot committed after the notice, before `t`."""
        return [step for at, step, _ in self.commits if at < t]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reached": self.reached, "recomputed_steps": self.recomputed_steps}


_COMMIT = re.compile(r"checkpoint step (\d+) committed .*\(([\w-]+)\)")


def _old_boot(lines: list[str]) -> tuple[int, int]:
    """Indexes of the first notice line and of the new boot's first words after it ("resume point")."""
    start = next(
        (i for i, ln in enumerate(lines) if re.search(r"metadata notice: (maintenance-event=TERMINATE|upcoming)", ln)),
        None,
    )
    assert start is not None, "the workload never saw the notice"
    end = next((i for i in range(start, len(lines)) if re.search(r"resume point: step \d+", lines[i])), None)
    assert end is not None, "no new boot resumed after the maintenance"
    return start, end


def notice_facts(cloud: dev.LocalCloud, log: str, machine_hint: str) -> NoticeFacts:
    """The facts of the first maintenance in a stage's workload log (all boots, oldest first) and the local
    cloud's record of it, on the VM whose id contains `machine_hint` (the run key)."""
    lines = [ln for ln in log.splitlines() if re.match(r"\d{4}-\d\d-\d\dT", ln)]
    start, end = _old_boot(lines)
    old, new = lines[start:end], lines[end:]
    notice = next((m for ln in old if (m := re.search(r"notice-to-commit \S+ \(step (\d+)\)", ln))), None)
    assert notice, "the workload never committed for the notice"
    steps = tuple(int(m[1]) for ln in old if (m := re.search(r"\] step (\d+)/", ln)))
    commits = tuple((line_time(ln), int(m[1]), m[2]) for ln in old if (m := _COMMIT.search(ln)))
    answers = tuple(
        int(m[1]) for ln in old if (m := re.search(r"control request \S+ answered with (?:held )?step (\d+)", ln))
    )
    hold = next(
        ((line_time(ln), int(m[1])) for ln in old if (m := re.search(r"holding at committed step (\d+)", ln))), None
    )
    reported = next((int(m[1]) for ln in new if (m := re.search(r"previous boot .* step (\d+)", ln))), 0)
    resume = re.search(r"resume point: step (\d+)", new[0])
    assert resume, new[0]
    trained = next((int(m[1]) for ln in new if (m := re.search(r"training \S+ steps (\d+)\.\.", ln))), None)
    assert trained is not None, "the new boot did not train"
    events = [e for e in cloud.admin.events() if machine_hint in str(e.get("machine"))]
    announced = next(e for e in events if e["event"] == "maintenance_notice")
    opened = next(e for e in events if e["event"] == "maintenance_start" and e["t"] >= announced["t"])
    performed = [
        e["t"] for e in events if e["event"] == "perform_maintenance" and announced["t"] <= e["t"] <= opened["t"]
    ]
    return NoticeFacts(
        notice_at=line_time(lines[start]),
        notice_step=int(notice[1]),
        steps=steps,
        commits=commits,
        control_answers=answers,
        held_at=hold[1] if hold else None,
        held_since=hold[0] if hold else None,
        last_reported_step=reported,
        resume_step=int(resume[1]),
        first_new_step=trained,
        window_start=datetime.fromisoformat(announced["window_start"].replace("Z", "+00:00")).timestamp(),
        performed_at=performed[0] if performed else None,
        opened_at=float(opened["t"]),
        opened_by=str(opened.get("cause")),
    )


# A held window's latest start, in notices after its start: the bound by which the local cloud opens it anyway
# (4 hours of an hour's notice: 96 real s at 150x), far past any moment a working control plane would pick.
HELD_LATEST_NOTICES = 4


@dataclass(frozen=True)
class Announced:
    """A maintenance Google announced on a run's VM (the local cloud's admin API)."""

    t: float
    zone: str
    name: str
    run_key: str
    held: bool


def announce_when_training(
    cloud: dev.LocalCloud,
    bucket: str,
    at_step: int = NOTICE_AT_STEP,
    timeout: float = 300,
    held: bool = False,
    notice_s: float = GPU_NOTICE_S,
) -> list[Announced]:
    """In the background: once the train stage's progress shows step ``at_step``, Google announces a SCHEDULED
    host maintenance ``notice_s`` ahead (an hour by default) on the run's GPU VM (the local cloud's admin API).
    Returns what it announced. The progress the test reads lags the trainer (the workload uploads it every
    second or so), so the notice lands some steps past ``at_step``: leave steps to spare.

    ``held``: the window does not open on the scenario's clock but when the product starts it
    (performMaintenance), when the test opens it (:func:`open_when_held`), or at its latest start,
    HELD_LATEST_NOTICES notices after its start. The notice the control plane and the workload read is the same."""
    import threading

    announced: list[Announced] = []
    latest = HELD_LATEST_NOTICES * notice_s if held else None

    def loop() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not announced:
            for m in cloud.admin.machines():
                if m["kind"] != "gce":
                    continue
                run_key = m["name"].rsplit("-", 1)[0]
                if _progress(cloud, bucket, run_key).get("step", 0) >= at_step:
                    cloud.admin.maintenance(
                        "gce", m["zone"], m["name"], "SCHEDULED", notice_s, held=held, latest_start_after=latest
                    )
                    announced.append(Announced(time.time(), m["zone"], m["name"], run_key, held))
                    break
            time.sleep(0.2)

    threading.Thread(target=loop, daemon=True).start()
    return announced


def _progress(cloud: dev.LocalCloud, bucket: str, run_key: str, stage: str = "train") -> dict[str, Any]:
    from interlude_workload.checkpoints import CheckpointStore

    progress = CheckpointStore(bucket, run_key, stage, client=dev.gcs_client(cloud)).read_progress() or {}
    return {**progress, "step": int(progress.get("step") or 0)}


def open_when_held(cloud: dev.LocalCloud, bucket: str, announced: list[Announced], timeout: float = 600) -> None:
    """In the background: once the workload holds after the held notice (its own progress says ``holding``), the
    test opens the window (at once, or at its windowStartTime if that is still ahead). What the old policy waits
    for, in order: the hold first, then the window, however slow the machine. Stops when the window opened anyway
    (performMaintenance, its latest start)."""
    import threading
    import urllib.error

    def loop() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not announced:
            time.sleep(0.2)
        if not announced:
            return
        a = announced[0]
        machine = f"gce-{a.zone}-{a.name}"
        while time.monotonic() < deadline:
            if any(e["event"] == "maintenance_start" and e.get("machine") == machine for e in cloud.admin.events()):
                return
            if _progress(cloud, bucket, a.run_key).get("state") == "holding":
                try:
                    cloud.admin.open_window("gce", a.zone, a.name)
                except urllib.error.HTTPError as e:  # opened meanwhile: nothing left to hold
                    if e.code != 400:
                        raise
                return
            time.sleep(0.2)

    threading.Thread(target=loop, daemon=True).start()


def maintenance_starts(cloud: dev.LocalCloud, run_key: str) -> list[float]:
    """When the local cloud started a maintenance on this run's machine (its own event log)."""
    return [
        e["t"] for e in cloud.admin.events() if e["event"] == "maintenance_start" and run_key in str(e.get("machine"))
    ]


def run_with_notice(
    cloud: dev.LocalCloud,
    env: dict[str, str],
    bucket: str,
    policy: str,
    log_path: Path,
    timeout: float = 600,
    also_at_step: int | None = None,
    also_notice_s: float = GPU_NOTICE_S,
    extra: dict[str, Any] | None = None,
    held: bool = False,
    open_on_hold: bool = False,
) -> tuple[dev.DagTestResult, str, NoticeFigures | None]:
    """One lifecycle run with a notice mid-training (and another, ``also_notice_s`` ahead, at ``also_at_step``);
    the figures of the first maintenance of its train stage (None: no notice came). ``held``: the notices' windows
    are held (see :func:`announce_when_training`); ``open_on_hold``: the test opens the first one once the
    workload holds (:func:`open_when_held`), else only the product (performMaintenance) or the latest start opens
    it."""
    from interlude_workload.checkpoints import CheckpointStore

    announced = announce_when_training(cloud, bucket, held=held)
    if open_on_hold:
        open_when_held(cloud, bucket, announced, timeout)
    if also_at_step is not None:
        announce_when_training(cloud, bucket, also_at_step, held=held, notice_s=also_notice_s)
    conf = {**CONF, "bucket": bucket, "maintenance_policy": policy, **(extra or {})}
    result = dev.dags_test(env, DAG_ID, conf, log_path, timeout=timeout)
    assert result.run_id, f"no run finished; log tail:\n{result.log[-3000:]}"
    run_key = naming.run_key(DAG_ID, result.run_id)
    if not announced:
        return result, run_key, None
    starts = maintenance_starts(cloud, run_key)
    # a held window opens only when the product (or the test) starts it: how many did is the caller's verdict
    assert starts if held else len(starts) == 1 + (also_at_step is not None), f"maintenances of {run_key}: {starts}"
    log = str(CheckpointStore(bucket, run_key, "train", client=dev.gcs_client(cloud)).read_log())
    log_path.with_suffix(".workload.log").write_text(log)
    if held:  # the seconds are for reading only: the caller's verdicts are facts (notice_facts)
        try:
            return result, run_key, figures(log, starts[0])
        except AssertionError:
            return result, run_key, None
    return result, run_key, figures(log, starts[0])
