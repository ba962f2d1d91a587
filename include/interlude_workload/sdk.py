"""The SDK a training loop calls to live by Interlude's checkpoint contract.

One object, :class:`Checkpointer`, answers the three questions a loop has:

* where do I resume? (:meth:`Checkpointer.start` returns the latest committed, verified checkpoint);
* should I checkpoint now? (:meth:`Checkpointer.step_finished` returns a reason or None: periodic,
  final, SIGTERM, a maintenance notice from the metadata server, a control-plane request, or the
  maintenance window drawing near);
* commit this step (:meth:`Checkpointer.commit` writes arrays + JSON state through
  :mod:`interlude_workload.checkpoints`, COMMITTED last, and answers control requests).

Around that it keeps the machine honest with the control plane: progress.json about once a second, the
log to stdout and to GCS chunks, a hold (no stepping) right before a maintenance window so that no step
is computed twice, and exit-after-commit on SIGTERM. The reference trainer uses exactly this code path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import FrameType, TracebackType
from typing import Any

import numpy as np
from google.cloud import storage

from interlude_workload.checkpoints import Checkpoint, CheckpointStore, log_writer_id, now_iso
from interlude_workload.gcs import storage_client
from interlude_workload.maintenance import MaintenanceWatcher, Notice, metadata_url_from_env
from interlude_workload.retention import Retainer

ARRAYS_FILE = "arrays.npz"
STATE_FILE = "state.json"
EXIT_SIGTERM = 143
LOG_CHUNK_BYTES = 64 * 1024
BOOT_ID_ENV = "INTERLUDE_BOOT_ID"
BOOT_STARTED_ENV = "INTERLUDE_BOOT_STARTED_AT"
KERNEL_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """Something that changes on every boot of the machine and only then.

    The startup script (run once per boot) exports it; on a real VM it is the kernel's boot id
    (https://man7.org/linux/man-pages/man4/random.4.html); without either, this process's id, which at
    least changes with every start of the workload.
    """
    value = os.environ.get(BOOT_ID_ENV, "").strip()
    if value:
        return value
    try:
        with open(KERNEL_BOOT_ID) as f:
            return f.read().strip() or log_writer_id()
    except OSError:
        return log_writer_id()


def boot_started_at() -> float:
    """When this boot started (epoch seconds): from the startup script, else the kernel's uptime."""
    try:
        return float(os.environ[BOOT_STARTED_ENV])
    except (KeyError, ValueError):
        pass
    try:
        with open("/proc/uptime") as f:
            return time.time() - float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()


@dataclass
class Restored:
    """A checkpoint read back: numpy arrays and the JSON state the loop stored with them."""

    step: int
    arrays: dict[str, np.ndarray]
    state: dict[str, Any]
    checkpoint: Checkpoint


def encode_payload(arrays: Mapping[str, np.ndarray], state: Mapping[str, Any]) -> dict[str, bytes]:
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.asarray(value) for name, value in sorted(arrays.items())})
    return {ARRAYS_FILE: buffer.getvalue(), STATE_FILE: json.dumps(state, sort_keys=True).encode()}


def decode_payload(files: Mapping[str, bytes]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with np.load(io.BytesIO(files[ARRAYS_FILE]), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    state = json.loads(files[STATE_FILE]) if STATE_FILE in files else {}
    return arrays, state


def weights_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


class Checkpointer:
    """Checkpoint/resume/notice handling for one stage of one run. Use as a context manager."""

    def __init__(
        self,
        bucket: str,
        run_key: str,
        stage: str,
        *,
        total_steps: int,
        checkpoint_every: int,
        keep: int = 3,
        metadata_url: str | None = "",
        hold_margin_seconds: float = 10.0,
        hold_margin_commits: float = 0.0,
        max_hold_seconds: float = 1800.0,
        control_poll_seconds: float = 1.0,
        progress_seconds: float = 1.0,
        fresh: str | None = None,
        hold_at_step: int | None = None,
        handle_sigterm: bool = True,
        control_requests: bool = True,
        client: storage.Client | None = None,
    ) -> None:
        """``metadata_url``: "" = from INTERLUDE_METADATA_URL or Google's; None = do not watch.

        ``handle_sigterm`` / ``control_requests``: False = die on SIGTERM like a plain process / ignore the
        control plane's checkpoint requests (with ``metadata_url=None``: periodic checkpoints only, the naive
        baseline ``benchmarks/badput.py`` compares against).

        ``fresh``: wipe this stage's checkpoints before starting, once per distinct token (a startup
        script runs again on every boot, so a plain "always wipe" would throw away progress after every
        maintenance; the token makes the wipe happen only on the first boot that carries it).
        """
        if total_steps < 1 or checkpoint_every < 1:
            raise ValueError("total_steps and checkpoint_every must be >= 1")
        self.store = CheckpointStore(bucket, run_key, stage, client=client)
        self.total_steps = total_steps
        self.checkpoint_every = checkpoint_every
        self.keep = keep
        self.metadata_url = metadata_url_from_env() if metadata_url == "" else metadata_url
        self.hold_margin = timedelta(seconds=hold_margin_seconds)
        self.hold_margin_commits = hold_margin_commits
        self.max_hold_seconds = max_hold_seconds
        self.control_poll_seconds = control_poll_seconds
        self.progress_seconds = progress_seconds
        self.fresh = fresh
        self.hold_at_step = hold_at_step
        self.handle_sigterm = handle_sigterm
        self.control_requests = control_requests

        self._lock = threading.RLock()  # log() takes it too, also from code that already holds it
        self._wake = threading.Event()  # set on notice changes: interrupts holds (never from the signal handler)
        self._pace_late = 0.0  # how late the last paced sleep ended: taken off the next one (pace)
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watcher: MaintenanceWatcher | None = None
        self._notice = Notice()
        self._notice_seq = 0
        self._notice_handled = 0
        self._notice_at: float | None = None  # monotonic time the current notice arrived
        self._notice_reported = True
        self._hold_committed_step: int | None = None
        self._hold_timed_out_seq = -1
        self._drill_hold: int | None = None  # the committed step held at for a drill, until released
        self._drill_notice_seen = False
        self._sigterm_at: float | None = None
        self._sigterm_logged = False
        self._pending: set[str] = set()
        self._acked: set[str] = set()
        self._last_committed: int | None = None
        self._commit_seconds: list[float] = []  # the last few commits' durations (this boot's own measure)
        self._log_buffer: list[str] = []
        self._log_seq = 0
        self._chunk_lines: list[str] = []
        self._writer_id = log_writer_id()
        self._progress: dict[str, Any] = {}
        self._progress_dirty = False
        self._retention_due = False  # a commit that starts a hold leaves its retention to the hold
        self._retainer = Retainer(self._own_store, keep, self.log)  # off the loop: see retention.py
        self._flush_lock = threading.Lock()  # one upload of log + progress at a time: the reporter, a hold, close
        self._rate_window: list[tuple[float, int]] = []
        self._first_step: tuple[float, int] | None = None
        self._previous_handler: Any = None
        self._finished_before = False  # the final step was committed before this process started

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close("failed" if exc_type and exc_type is not SystemExit else None)

    def start(self) -> Restored | None:
        """Start watchers and reporters; return the checkpoint to resume from (None: start at step 0)."""
        if self.handle_sigterm and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.fresh:
            if self.store.fresh_token() != self.fresh:
                count = self.store.wipe()
                self.store.set_fresh_token(self.fresh)
                self.log(f"start fresh (token {self.fresh}): removed {count} objects of this stage")
            else:
                self.log(f"fresh token {self.fresh} already applied; resuming")
        restored = self.restore()
        if restored is not None:
            self._last_committed = restored.step
            if restored.step >= self.total_steps:
                # Finished by an earlier boot (the agent walks past finished stages after every reboot): that
                # boot's progress - when the stage finished, its step time - is the record the run's report reads.
                # This pass trains nothing and must not move it (it did: a stage "finished" after the next one's
                # maintenance, and its step time was lost).
                self._finished_before = True
                return restored
        previous = self.store.read_progress() or {}
        started_at = previous.get("stage_started_at") if restored is not None else None
        boot = boot_id()
        before = previous.get("boot_id") if previous.get("boot_id") != boot else None
        if before:
            self.log(
                f"new boot {boot} (previous boot {before} last reported at "
                f"{previous.get('updated_at')}, step {previous.get('step')}, {previous.get('state')})"
            )
        self._set_progress(
            boot_id=boot,
            process_id=self._writer_id,
            boot_started_at=round(boot_started_at(), 3),
            previous_boot_id=before or previous.get("previous_boot_id"),
            previous_boot_ended_at=previous.get("updated_at_epoch")
            if before
            else previous.get("previous_boot_ended_at"),
            hold_at_step=self.hold_at_step,
            resumed_from=restored.step if restored is not None else 0,
            stage_started_at=float(started_at) if started_at else time.time(),
            total_steps=self.total_steps,
            state="starting",
        )
        if self.control_requests:
            self._spawn(self._control_loop, "interlude-control")
        self._spawn(self._report_loop, "interlude-report")
        if self.metadata_url:
            self._watcher = MaintenanceWatcher(self.metadata_url, self._on_notice, log=self.log)
            self._watcher.start()
        return restored

    def restore(self, stage: str | None = None) -> Restored | None:
        """Latest committed+verified checkpoint of this stage (or another stage of the same run)."""
        store = self.store if stage is None else self.store.for_stage(stage)
        checkpoint, files, rejected = store.restore()
        for rejection in rejected:
            self.log(f"skipped {store.stage} step {rejection.step}: {rejection.reason}")
        if checkpoint is None:
            return None
        arrays, state = decode_payload(files)
        which = "resume point" if stage is None else f"latest of stage {store.stage}"
        self.log(f"{which}: step {checkpoint.step} ({checkpoint.uri})")
        return Restored(step=checkpoint.step, arrays=arrays, state=state, checkpoint=checkpoint)

    def close(self, final_state: str | None = None) -> None:
        """Stop background threads and flush progress and log (idempotent)."""
        if self._closing.is_set():
            return
        if final_state is None:
            done = self._last_committed is not None and self._last_committed >= self.total_steps
            final_state = "done" if done else "stopped" if self._sigterm_at is not None else "exited"
        if not self._finished_before:
            self._set_progress(state=final_state)
        self._closing.set()
        self._wake.set()
        if self._watcher is not None:
            self._watcher.stop()
        self._retainer.close()
        for thread in self._threads:
            thread.join(timeout=10)
        self._flush()
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _spawn(self, target: Any, name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # ----------------------------------------------------------------- the loop's questions
    @property
    def stop_requested(self) -> bool:
        """True once SIGTERM arrived: commit (step_finished says so), then exit."""
        if self._sigterm_at is not None and not self._sigterm_logged:
            self._sigterm_logged = True
            self.log("SIGTERM received: committing the current step (if not committed yet), then exiting")
        return self._sigterm_at is not None

    @property
    def last_committed_step(self) -> int | None:
        return self._last_committed

    def step_finished(self, step: int, loss: float | None = None, **metrics: Any) -> str | None:
        """Record progress of a finished step; return why it must be committed now, or None."""
        self._record_progress(step, loss, metrics)
        if step == self._last_committed:
            return None
        with self._lock:
            if self.stop_requested:
                return "sigterm"
            if step >= self.total_steps:
                return "final"
            if self._notice_seq > self._notice_handled:
                return "notice"
            if self._pending:
                return "control"
            if self._hold_due():
                return "maintenance-hold"
            if step == self.hold_at_step:
                return "drill-hold"
        if step % self.checkpoint_every == 0:
            return "periodic"
        return None

    def commit(
        self,
        step: int,
        arrays: Mapping[str, np.ndarray],
        state: Mapping[str, Any],
        metrics: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        reason: str = "",
    ) -> Checkpoint:
        """Write and commit ``step``; then answer requests, report notice latency, apply retention."""
        with self._lock:
            notice_seq, pending = self._notice_seq, set(self._pending)
        started = time.monotonic()
        result = self.store.write(step, encode_payload(arrays, state), metrics=metrics, extra=extra)
        elapsed = time.monotonic() - started
        self._last_committed = step
        self._commit_seconds = [*self._commit_seconds[-4:], elapsed]
        how = "committed" if result.written else "already committed"
        self.log(f"checkpoint step {step} {how} in {elapsed:.3f}s ({reason or 'request'}) {result.checkpoint.uri}")
        for request_id in sorted(pending):
            self.store.acknowledge(request_id, step)
            self.log(f"control request {request_id} answered with step {step}")
        with self._lock:
            self._pending -= pending
            self._acked |= pending
            if notice_seq > self._notice_handled:
                self._notice_handled = notice_seq
                if self._notice_at is not None and not self._notice_reported:
                    self._notice_reported = True
                    self.log(f"notice-to-commit {time.monotonic() - self._notice_at:.3f}s (step {step})")
            if self._hold_due():
                self._hold_committed_step = step
            if step == self.hold_at_step:
                self._drill_hold = step
            holds_next = self._hold_committed_step == step or self._drill_hold == step
        self._set_progress(
            last_checkpoint_step=step,
            last_checkpoint_uri=result.checkpoint.uri,
            commit_seconds=round(max(self._commit_seconds), 4),
        )
        if holds_next:  # the hold is said first (the control plane may start the window then): see wait_while_held
            self._retention_due = True
        else:
            self._retain()
        return result.checkpoint

    def _retain(self) -> None:
        """Ask for retention of older checkpoints; it runs in the background (retention.py), the loop trains on."""
        self._retention_due = False
        self._retainer.request()

    def _own_store(self) -> CheckpointStore:
        """This stage's store with a storage client of its own, for a background thread."""
        return CheckpointStore(self.store.bucket_name, self.store.run_key, self.store.stage, client=storage_client())

    def wait_while_held(self) -> None:
        """Block while a maintenance window is imminent, or at the drill step, and this step is committed.

        Returns when the notice clears (training continues), when a drill's maintenance passed without
        a restart, after ``max_hold_seconds``, or on SIGTERM (the loop then sees :attr:`stop_requested`;
        its step is already committed, so nothing is lost). Control requests that arrive meanwhile are
        answered with the held step: it is the state the workload will resume from.
        """
        with self._lock:
            committed = self._last_committed
            notice_hold = self._hold_due() and self._hold_committed_step == committed
            drill_hold = self._drill_hold is not None and self._drill_hold == committed
        if not (notice_hold or drill_hold):
            return
        what = (
            f"maintenance near ({self._notice.describe()})"
            if notice_hold
            else f"drill step {committed}: waiting for the simulated maintenance"
        )
        self.log(f"holding at committed step {committed}: {what}")
        self._set_progress(state="holding", held_at=committed)
        # Said now, not at the reporter's next turn (up to progress_seconds later): the control plane starts a
        # pending maintenance early when it sees the hold, and each moment before it does is an idle machine. The
        # progress alone (one small upload; the log goes at the reporter's turn), and the retention of older
        # checkpoints after it, in the hold (a commit that starts a hold leaves it for here).
        self._flush(log=False)
        if self._retention_due:
            self._retain()
        deadline = time.monotonic() + self.max_hold_seconds
        why = "closing"
        while not self._closing.is_set() and not self.stop_requested:
            self._answer_while_held()
            with self._lock:
                reason = self._release_reason(deadline)
            if reason is not None:
                why = reason
                break
            self._wake.wait(0.2)
            self._wake.clear()
        if not self.stop_requested:
            self.log(f"hold released: {why}")
            self._set_progress(state="running", held_at=None)
            self._flush()  # a hold still shown after it ended could start a maintenance early mid-training

    def _release_reason(self, deadline: float) -> str | None:
        """Caller holds the lock. Why the hold ends now, or None to keep holding."""
        if time.monotonic() >= deadline:
            self._hold_timed_out_seq = self._notice_seq  # train on until a new notice arrives
            self._drill_hold = None
            return f"held {self.max_hold_seconds:.0f}s and the machine is still up"
        if self._drill_hold is not None:
            if self._notice.active:
                self._drill_notice_seen = True
                return None
            if self._drill_notice_seen:
                self._drill_hold = None
                return "the drill's maintenance passed without a restart"
            return None
        if not self._hold_due():
            return "notice cleared" if not self._notice.active else "window not near yet"
        return None

    def _answer_while_held(self) -> None:
        """Answer control requests and notices with the committed step held at (no new step comes)."""
        with self._lock:
            pending, step = set(self._pending), self._last_committed
            self._notice_handled = self._notice_seq
        if not pending or step is None:
            return
        try:
            for request_id in sorted(pending):
                self.store.acknowledge(request_id, step)
                self.log(f"control request {request_id} answered with held step {step}")
        except Exception as exc:  # noqa: BLE001 - answered on the next pass
            self.log(f"answering control requests failed (will retry): {exc}")
            return
        with self._lock:
            self._pending -= pending
            self._acked |= pending

    def pace(self, step_started: float, step_seconds: float) -> None:
        """Sleep until ``step_started + step_seconds`` (monotonic), waking early on SIGTERM (polled every 0.1 s).

        A plain sleep, not a wait on ``_wake``: a notice sets that event and only a hold clears it, so from the
        notice to the hold every wait here returned at once and pacing spun a whole core (the hour of a
        maintenance notice; 6 s per event in benchmarks/badput.py, on a 2-core machine shared with the control
        plane). A notice never shortened a step anyway: the loop only ends at the deadline or on SIGTERM.

        The paced part of a step stands for an accelerator's compute, whose length the host's scheduler does not
        change. A sleep that ends late (the OS woke the trainer after the deadline: a loaded host) is taken off the
        next step's sleep, at most half a step, so the steps keep their length on average. Only oversleep is
        carried: a step whose own work took its whole budget (the model, the SDK's threads in this process, a
        commit) sleeps nothing and carries nothing, so time the workload really spent stays spent."""
        target = step_started + step_seconds - self._pace_late
        self._pace_late = 0.0
        if time.monotonic() >= target:
            return
        while not self.stop_requested:
            remaining = target - time.monotonic()
            if remaining <= 0:
                self._pace_late = min(-remaining, step_seconds / 2)
                return
            time.sleep(min(remaining, 0.1))

    # ----------------------------------------------------------------- logs and progress
    def log(self, message: str) -> None:
        line = f"{now_iso()} [{self.store.run_key}/{self.store.stage}] {message}"
        with self._lock:
            self._log_buffer.append(line)
            try:  # one write per line: threads must not interleave; a dead console must not stop training
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                pass

    def _record_progress(self, step: int, loss: float | None, metrics: Mapping[str, Any]) -> None:
        now = time.monotonic()
        if self._first_step is None:
            self._first_step = (now, step - 1)
        t_first, s_first = self._first_step
        mean = (now - t_first) / (step - s_first) if step > s_first else None
        self._rate_window.append((now, step))
        self._rate_window = [(t, s) for t, s in self._rate_window if now - t <= 10.0] or [(now, step)]
        t0, s0 = self._rate_window[0]
        rate = (step - s0) / (now - t0) if now > t0 and step > s0 else None
        eta = (self.total_steps - step) / rate if rate else None
        self._set_progress(
            step=step,
            total_steps=self.total_steps,
            loss=loss,
            steps_per_second=round(rate, 4) if rate else None,
            eta_seconds=round(eta, 1) if eta is not None else None,
            mean_step_seconds=round(mean, 6) if mean is not None else None,
            metrics=dict(metrics),
            state=self._progress.get("state") if self._progress.get("state") == "holding" else "running",
        )

    def _set_progress(self, **fields: Any) -> None:
        with self._lock:
            self._progress.update(fields)
            self._progress.update(
                run_key=self.store.run_key,
                stage=self.store.stage,
                updated_at=now_iso(),
                updated_at_epoch=time.time(),
            )
            self._progress_dirty = True

    def _flush(self, log: bool = True) -> None:
        """Upload new log lines (unless ``log`` is False) and changed progress (from the reporter thread, at a
        hold, and once at close).

        The log goes to a rolling chunk: the current chunk object is rewritten with its new lines until
        it passes LOG_CHUNK_BYTES, then the next one starts, so a long run makes few objects and a failed
        upload loses nothing (the lines stay in the chunk and go up with the next flush). One flush at a time:
        two at once would race on the chunk, and an older progress could land after a newer one.
        """
        with self._flush_lock:
            self._flush_unlocked(log)

    def _flush_unlocked(self, log: bool) -> None:
        with self._lock:
            lines: list[str] = []
            if log:
                lines, self._log_buffer = self._log_buffer, []
            progress = dict(self._progress) if self._progress_dirty else None
            self._progress_dirty = False
        try:
            if lines:
                self._chunk_lines += lines
                self.store.write_log_chunk(self._writer_id, self._log_seq, self._chunk_lines)
                if sum(len(line) + 1 for line in self._chunk_lines) >= LOG_CHUNK_BYTES:
                    self._log_seq += 1
                    self._chunk_lines = []
            if progress is not None:
                self.store.write_progress(progress)
        except Exception as exc:  # noqa: BLE001 - reporting must never kill training
            with self._lock:
                self._progress_dirty = self._progress_dirty or progress is not None
            try:
                sys.stderr.write(f"progress/log upload failed (will retry): {exc}\n")
            except (OSError, ValueError):
                pass

    def _report_loop(self) -> None:
        while not self._closing.wait(self.progress_seconds):
            self._flush()

    # ----------------------------------------------------------------- signals, notices, requests
    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        # Only set a plain attribute: no print (it could re-enter a write the main thread is in the middle of) and
        # no lock. Event.set() takes the Event's lock, and the handler runs in the main thread: arriving while that
        # thread is inside _wake.wait()/clear() (holding the same non-reentrant lock) it deadlocked the trainer,
        # which then died by SIGKILL without its SIGTERM commit. pace() and holds poll the flag every <= 0.2 s.
        if self._sigterm_at is None:
            self._sigterm_at = time.monotonic()

    def _on_notice(self, notice: Notice) -> None:
        with self._lock:
            was_active = self._notice.active
            self._notice = notice
            if notice.active and not was_active:
                self._notice_seq += 1
                self._notice_at = time.monotonic()
                self._notice_reported = False
            if not notice.active:
                self._hold_committed_step = None
        self.log(f"metadata notice: {notice.describe()}")
        self._wake.set()

    def _hold_due(self) -> bool:
        """Caller holds the lock. True when the machine is about to go down for a known reason."""
        notice = self._notice
        if not notice.active or self._hold_timed_out_seq == self._notice_seq:
            return False
        start = notice.window_start
        if start is not None:
            return datetime.now(UTC) >= start - self.margin()
        return notice.imminent

    def margin(self) -> timedelta:
        """How long before a window the last checkpoint starts: ``hold_margin_seconds``, or with
        ``hold_margin_commits`` that many times what getting a checkpoint committed really costs here (one
        step to reach the check, then the commit; the slowest of the last few commits), if longer."""
        if self.hold_margin_commits <= 0 or not self._commit_seconds:
            return self.hold_margin
        mean = self._progress.get("mean_step_seconds") or 0.0
        cost = float(mean) + max(self._commit_seconds)
        return max(self.hold_margin, timedelta(seconds=self.hold_margin_commits * cost))

    def _control_loop(self) -> None:
        store = self._own_store()
        while not self._closing.wait(self.control_poll_seconds):
            try:
                pending = set(store.pending_requests())
            except Exception as exc:  # noqa: BLE001 - a flaky poll is retried next second
                self.log(f"control poll failed: {exc}")
                continue
            with self._lock:
                new = pending - self._acked - self._pending
                self._pending |= new
            if new:
                self.log(f"control request(s) {sorted(new)}: checkpoint at the next step")
