"""A stage run by the user's own job: a process that checkpoints with plain Orbax and knows nothing of Interlude.

Why: a team on TPUs already has a trainer (MaxText, their own JAX loop) that saves with Orbax's
``CheckpointManager`` and, like MaxText, saves and exits on SIGTERM (what a machine going down sends). Interlude
must watch and resume it without asking for a rewrite. The agent runs such a stage through :class:`UserJob`, which
stands in for the SDK around a job that has none:

* **Progress** is what the job committed: the latest step Orbax finalised in the stage's prefix (one listing),
  written to ``progress.json`` with the boot id and the step it resumed from, so the stage trigger, the watchdog and
  the report read a plain job as they read the reference trainer.
* **Checkpoint now** (a control request, a maintenance notice whose window is near, the drill's step reached) is
  a SIGTERM to the job's process group: the job saves its current step and exits. Its committed step then answers
  the request, and the stage holds there (``state: holding``) until the machine goes down, the notice passes, or
  ``max_hold_seconds``; then the job is started again and resumes from that step. A job cannot be asked to hold
  at a step, so no step is computed twice only when its SIGTERM save is the step it stopped at (MaxText's is).
* **SIGTERM to the agent** (the machine going down) goes on to the job, which saves; the agent then stops.

The job's stdout and stderr go to the serial console and, line by line, into the stage's log in GCS (where the
control plane and the tests read a workload's own account). The command is an argv list run without a shell.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from interlude_workload import job_command, layout
from interlude_workload.boot import boot_id, boot_started_at
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.maintenance import MaintenanceWatcher, Notice, metadata_url_from_env
from interlude_workload.orbax_env import EVERYWHERE, emulator_endpoint, environment_for
from interlude_workload.orbax_layout import checkpoints_prefix
from interlude_workload.plan import StagePlan
from interlude_workload.stage_files import log_writer_id

POLL_SECONDS = 1.0  # two listings a poll (commits, control requests): cheap, and a step is seconds at least
LOG_FLUSH_SECONDS = 2.0
STOP_GRACE_SECONDS = 600.0  # a save of a large state takes minutes; the machine's own grace is the real bound
MAX_HOLD_SECONDS = 3600.0  # as the SDK's: a hold whose maintenance never comes ends, and the job trains on


def job_values(plan: StagePlan, bucket: str, run_key: str) -> dict[str, str]:
    """The placeholders' values for one stage (see interlude_workload.job_command.PLACEHOLDERS)."""

    def root(stage: str) -> str:  # as CheckpointStore.checkpoints_uri names it (no trailing slash)
        return f"gs://{bucket}/{checkpoints_prefix(layout.stage_prefix(run_key, stage)).rstrip('/')}"

    return {
        "checkpoint_dir": root(plan.stage),
        "init_from_dir": root(plan.init_from_stage) if plan.init_from_stage else "",
        "steps": str(plan.steps),
        "checkpoint_every": str(plan.checkpoint_every),
        "seed": str(plan.seed),
        "stage": plan.stage,
        "run_key": run_key,
        "bucket": bucket,
        "data_date": plan.data_date or "",
    }


def job_environment(values: dict[str, str]) -> dict[str, str]:
    """The agent's environment, the placeholders as INTERLUDE_JOB_*, gcsfs without its stale listings (orbax_env),
    and Orbax pointed at a local GCS if any."""
    env = {**EVERYWHERE, **os.environ, **job_command.environment(values)}  # EVERYWHERE: defaults the job may override
    endpoint = emulator_endpoint()
    if endpoint is not None:
        env.update(environment_for(endpoint))
    return env


class UserJob:
    """One stage of a user's job on this boot; ``wait()`` runs it and returns its exit code (0: done)."""

    def __init__(self, plan: StagePlan, bucket: str, run_key: str, poll: float = POLL_SECONDS) -> None:
        if not plan.command:
            raise ValueError("a UserJob needs a plan with a command")
        self.plan, self.poll = plan, poll
        self.store = CheckpointStore(bucket, run_key, plan.stage)
        self.values = job_values(plan, bucket, run_key)
        self.argv = job_command.render(plan.command, self.values)
        self.env = job_environment(self.values)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False  # the agent's SIGTERM: the machine is going down
        self.returncode: int | None = None
        self._notice = Notice()
        self._notice_seen_in_hold = False
        self._drill_done = plan.hold_at_step is None
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()
        self._writer = log_writer_id()
        self._seq = 0
        self._progress: dict[str, Any] = {}
        self._committed = 0

    # ------------------------------------------------------------------ the agent's side
    def send_signal(self, signum: int) -> None:
        """The agent's SIGTERM handler: pass it to the job (it saves) and end the stage after it exits."""
        self.stopping = True
        self._signal_job(signum)

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = self._run()
        return self.returncode

    # ------------------------------------------------------------------ the stage
    def _run(self) -> int:
        self._committed = self._latest()
        if self._committed >= self.plan.steps:
            self.log(f"stage {self.plan.stage} already finished at step {self._committed}")
            return 0
        self._start_progress()
        # A request the last boot could not answer (the machine went down first) is answered by the step the job
        # left: it has not run on this boot, so that step is its state now. Holding for it would stop a job that
        # just started, for a maintenance already past; a notice still to come is seen and held for as always.
        for request_id in sorted(self.store.pending_requests()):
            self.store.acknowledge(request_id, self._committed)
            self.log(
                f"control request {request_id} (from before this boot) answered with committed step {self._committed}"
            )
        watcher = None
        if url := metadata_url_from_env():
            watcher = MaintenanceWatcher(url, self._on_notice, log=self.log)
            watcher.start()
        try:
            while True:
                rc, stopped_for = self._run_job_once()
                if self.stopping:
                    return rc
                if stopped_for is None:
                    return self._finished(rc)
                if not self._hold(stopped_for):
                    return 143  # the machine went down while holding: the next boot resumes
        finally:
            if watcher is not None:
                watcher.stop()
            self._flush_log()

    def _run_job_once(self) -> tuple[int, str | None]:
        """Start the job, watch it; (exit code, why Interlude stopped it or None if it ended by itself)."""
        self.log(f"resume point: step {self._committed}; starting {self.argv[0]}")
        self._set_progress(state="running", resumed_from=self._committed, stepping_at_epoch=round(time.time(), 3))
        # In the agent's process group, i.e. the machine's: a machine going down (on the local cloud, a signal to
        # that group) stops the job with everything else, as a VM's shutdown does; it must not outlive it.
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        reader = threading.Thread(target=self._read_output, args=(self.proc,), daemon=True)
        reader.start()
        if self.stopping:  # SIGTERM came while it started
            self._signal_job(signal.SIGTERM)
        stopped_for: str | None = None
        last_flush = time.monotonic()
        while self.proc.poll() is None:
            time.sleep(self.poll)
            self._observe_commits()
            if stopped_for is None and not self.stopping and (reason := self._stop_reason()) is not None:
                stopped_for = reason
                self.log(f"asking the job for a checkpoint (SIGTERM): {reason}")
                self._signal_job(signal.SIGTERM)
            if time.monotonic() - last_flush >= LOG_FLUSH_SECONDS:
                self._flush_log()
                last_flush = time.monotonic()
        reader.join(timeout=5)
        self._observe_commits()
        rc = self.proc.returncode
        self.log(f"job exited {rc} at committed step {self._committed}")
        return rc, stopped_for

    def _finished(self, rc: int) -> int:
        if rc == 0 and self._committed < self.plan.steps:
            self.log(f"the job exited 0 but its last committed step is {self._committed} of {self.plan.steps}")
            return 1  # the agent retries: the next start resumes from that step
        if rc == 0:
            self._set_progress(state="done")
        return rc

    # ------------------------------------------------------------------ checkpoint now, and hold
    def _stop_reason(self) -> str | None:
        if not self._drill_done and self._committed >= (self.plan.hold_at_step or 0):
            return f"drill step {self.plan.hold_at_step} committed"
        if self._hold_due(self._notice):
            return f"maintenance near ({self._notice.describe()})"
        if self.store.pending_requests():
            return "the control plane asked for a checkpoint"
        return None

    def _hold_due(self, notice: Notice) -> bool:
        if not notice.active:
            return False
        start = notice.window_start
        if start is None:
            return notice.imminent
        margin = timedelta(seconds=self.plan.hold_margin_seconds or 0.0)
        return datetime.now(UTC) >= start - margin

    def _hold(self, why: str) -> bool:
        """Hold at the committed step the job left; True to start the job again, False: the machine went down."""
        held = self._committed
        self._answer_requests(held)
        self.log(f"holding at committed step {held}: {why}")
        self._set_progress(state="holding", held_at=held)
        self._flush_log()
        drill = not self._drill_done
        self._notice_seen_in_hold = self._notice.active
        deadline = time.monotonic() + MAX_HOLD_SECONDS
        while not self.stopping:
            self._answer_requests(held)
            if self._notice.active:
                self._notice_seen_in_hold = True
            elif self._notice_seen_in_hold or (not drill and not self._hold_due(self._notice)):
                break  # the maintenance passed without taking the machine (or the notice cleared)
            if time.monotonic() >= deadline:
                break
            time.sleep(self.poll)
        if self.stopping:
            return False
        self._drill_done = True
        self.log(f"hold released at step {held}: the job starts again")
        self._set_progress(state="running", held_at=None)
        return True

    def _answer_requests(self, step: int) -> None:
        for request_id in sorted(self.store.pending_requests()):
            self.store.acknowledge(request_id, step)
            self.log(f"control request {request_id} answered with held step {step}")

    def _on_notice(self, notice: Notice) -> None:
        self._notice = notice
        self.log(f"maintenance notice: {notice.describe()}")

    def _signal_job(self, signum: int) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signum)  # the job's main process: it saves (a launcher passes it on to its workers)

    # ------------------------------------------------------------------ what the control plane reads
    def _latest(self) -> int:
        committed = [s.step for s in self.store.scan() if s.committed]
        return committed[-1] if committed else 0

    def _observe_commits(self) -> None:
        latest = self._latest()
        if latest != self._committed:
            self._committed = latest
            self._set_progress(step=latest)

    def _start_progress(self) -> None:
        previous = self.store.read_progress() or {}
        boot = boot_id()
        before = previous.get("boot_id") if previous.get("boot_id") != boot else None
        self._progress = {
            "boot_id": boot,
            "process_id": self._writer,
            "boot_started_at": round(boot_started_at(), 3),
            "previous_boot_id": before or previous.get("previous_boot_id"),
            "previous_boot_ended_at": previous.get("updated_at_epoch")
            if before
            else previous.get("previous_boot_ended_at"),
            "stage_started_at": previous.get("stage_started_at") or time.time(),
            "total_steps": self.plan.steps,
            "step": self._committed,
            "workload": "user_job",
        }

    def _set_progress(self, **fields: Any) -> None:
        self._progress.update(fields, updated_at_epoch=round(time.time(), 3))
        self.store.write_progress(self._progress)

    # ------------------------------------------------------------------ logs
    def log(self, message: str) -> None:
        line = f"{datetime.now(UTC).isoformat(timespec='milliseconds')} interlude-job: {message}"
        self._emit(line)

    def _emit(self, line: str) -> None:
        print(line, flush=True)
        with self._lines_lock:
            self._lines.append(line)

    def _read_output(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            self._emit(raw.decode("utf-8", "replace").rstrip("\n"))

    def _flush_log(self, upload: Callable[[str, int, list[str]], str] | None = None) -> None:
        with self._lines_lock:
            lines, self._lines = self._lines, []
        if not lines:
            return
        try:
            (upload or self.store.write_log_chunk)(self._writer, self._seq, lines)
            self._seq += 1
        except Exception as exc:  # noqa: BLE001 - the serial console has every line; GCS gets them next time
            with self._lines_lock:
                self._lines = lines + self._lines
            print(f"interlude-job: log not written ({type(exc).__name__}: {exc})", flush=True)
