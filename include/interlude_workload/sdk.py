"""The SDK a training loop calls to live by Interlude's checkpoint contract: a thin layer over Orbax.

One object, :class:`Checkpointer`, answers the three questions a loop has:

* where do I resume? (:meth:`Checkpointer.start` restores the latest finalised, verified Orbax step);
* should I checkpoint now? (:meth:`Checkpointer.step_finished` returns a reason or None: periodic,
  final, SIGTERM, a maintenance notice from the metadata server, a control-plane request, or the
  maintenance window drawing near);
* commit this step (:meth:`Checkpointer.commit`: ``CheckpointManager.save(step, force=True)`` of the state pytree
  and its JSON side through :mod:`interlude_workload.orbax_io`, then the answers to control requests).

The checkpoint itself is Orbax's (one ``ocp.CheckpointManager`` per stage, rooted at ``STAGE/checkpoints/``): its
array I/O, finalisation, multi-host coordination and async saves. Periodic saves may run in the background
(``async_saves``: Orbax's ``enable_async_checkpointing``); a save for a notice, a request, SIGTERM, a hold or the
final step waits until Orbax finalised it before anything is acknowledged or the process exits.

Around that it keeps the machine honest with the control plane: progress.json about once a second, the
log to stdout and to GCS chunks, a hold (no stepping) right before a maintenance window so that no step
is computed twice, and exit-after-commit on SIGTERM. The reference trainer uses exactly this code path.
"""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from types import FrameType, TracebackType
from typing import Any

import numpy as np
from google.cloud import storage

from interlude_workload import distributed, orbax_io
from interlude_workload.boot import BOOT_ID_ENV, BOOT_STARTED_ENV, boot_id, boot_started_at
from interlude_workload.checkpoints import Checkpoint, CheckpointStore
from interlude_workload.gcs import storage_client
from interlude_workload.maintenance import MaintenanceWatcher, Notice, metadata_url_from_env
from interlude_workload.orbax_io import Restored
from interlude_workload.retention import Retainer
from interlude_workload.sdk_holds import Holding
from interlude_workload.sdk_progress import ProgressReporting
from interlude_workload.sdk_workers import Workers
from interlude_workload.stage_files import log_writer_id

__all__ = ["BOOT_ID_ENV", "BOOT_STARTED_ENV", "EXIT_SIGTERM", "Checkpointer", "Restored", "boot_id", "weights_digest"]

EXIT_SIGTERM = 143


def weights_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over names, dtypes, shapes and bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


class Checkpointer(ProgressReporting, Holding, Workers):
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
        async_saves: bool = False,
        client: storage.Client | None = None,
        workers: distributed.Workers | None = None,
    ) -> None:
        """``metadata_url``: "" = from INTERLUDE_METADATA_URL or Google's; None = do not watch.

        ``handle_sigterm`` / ``control_requests``: False = die on SIGTERM like a plain process / ignore the
        control plane's checkpoint requests (with ``metadata_url=None``: periodic checkpoints only, the naive
        baseline ``benchmarks/badput.py`` compares against).

        ``fresh``: wipe this stage's checkpoints before starting, once per distinct token (a startup
        script runs again on every boot, so a plain "always wipe" would throw away progress after every
        maintenance; the token makes the wipe happen only on the first boot that carries it).

        ``async_saves``: periodic saves finish in the background (Orbax's async checkpointing); every other
        reason still waits for Orbax to finalise its step.

        ``workers``: this process's place in a slice of several worker processes (one JAX program,
        ``jax.distributed`` initialised before this); every decision to commit, hold or stop is then the same on
        every worker (interlude_workload.sdk_workers). None: one worker.
        """
        if total_steps < 1 or checkpoint_every < 1:
            raise ValueError("total_steps and checkpoint_every must be >= 1")
        self.store = CheckpointStore(bucket, run_key, stage, client=client)
        self.workers = workers or distributed.Workers()
        self._stop_agreed = False  # several workers: every worker stops at the step they agreed on
        self._agreed_hold_step: int | None = None  # several workers: the step every worker holds at
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
        self.async_saves = async_saves
        self._manager: Any = None  # the stage's ocp.CheckpointManager, opened by start()
        self._in_flight: tuple[int, float, str] | None = None  # (step, started, reason) of a background save
        self._proven_bad: set[int] = set()  # finalised steps a restore here proved bad: saved again when reached

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
        self._writer_id = log_writer_id() + (f"-w{self.workers.index}" if self.workers.multi else "")
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

    def start(self, target: Any = None) -> Restored | None:
        """Start watchers and reporters; return the checkpoint to resume from (None: start at step 0).

        ``target``: the state's abstract tree for Orbax's restore (shapes, dtypes, shardings); None restores the
        arrays as they were saved (numpy)."""
        if self.handle_sigterm and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.fresh and self.workers.primary:
            if self.store.fresh_token() != self.fresh:
                count = self.store.wipe()
                self.store.set_fresh_token(self.fresh)
                self.log(f"start fresh (token {self.fresh}): removed {count} objects of this stage")
            else:
                self.log(f"fresh token {self.fresh} already applied; resuming")
        if self.workers.multi:
            distributed.agree(0)  # no worker reads the stage before worker 0 has wiped it (--fresh)
        orbax_io.bind(self.store)  # this process's Orbax writes where its store reads
        self._manager = orbax_io.open_manager(self.store, async_saves=self.async_saves)
        restored = self.restore(target=target)
        restored_at = time.time()  # the "resume point" line's moment, also in progress (the log may upload later)
        self._agree_on_resume(restored)
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
            stepping_at_epoch=round(time.time(), 3),  # the loop steps from here (the report's "resumed_at")
            restored_at_epoch=round(restored_at, 3) if restored is not None else None,
        )
        if self.control_requests and self.workers.primary:
            self._spawn(self._control_loop, "interlude-control")
        self._spawn(self._report_loop, "interlude-report")
        if self.metadata_url:
            self._watcher = MaintenanceWatcher(self.metadata_url, self._on_notice, log=self.log)
            self._watcher.start()
        return restored

    def restore(self, stage: str | None = None, target: Any = None) -> Restored | None:
        """Latest finalised, verified step of this stage (or of another stage of the same run), every array read.

        A step a successful read proved bad is skipped (and, in this stage, saved again when training reaches
        it); one that could not be read raises CheckpointUnreadable: nothing older is resumed from."""
        own = stage is None
        store = self.store if own else self.store.for_stage(stage)
        restored, rejected = orbax_io.restore_latest(store, self._manager if own else None, target)
        for rejection in rejected:
            self.log(f"skipped {store.stage} step {rejection.step}: {rejection.reason}")
            if own and rejection.corrupt:
                self._proven_bad.add(rejection.step)
        if restored is None:
            return None
        which = "resume point" if own else f"latest of stage {store.stage}"
        self.log(f"{which}: step {restored.step} ({restored.checkpoint.uri})")
        return restored

    def fail(self, error: str) -> None:
        """Say why this stage cannot finish, in the log and where the control plane looks (progress ``failed`` with
        ``error``), then close. Also after a final step committed by an earlier boot: its record is kept, with the
        failure added (an export that fails after the final commit)."""
        self.log(f"error: {error}")
        if self._finished_before:
            self._progress = {**(self.store.read_progress() or {}), **self._progress}
            self._finished_before = False
        self._set_progress(state="failed", error=error)
        self.close("failed")

    def close(self, final_state: str | None = None) -> None:
        """Stop background threads and flush progress and log (idempotent)."""
        if self._closing.is_set():
            return
        try:
            self._settle(wait=True)  # a background save finishes (or fails) before the state is told
        except Exception as exc:  # noqa: BLE001 - said, and the close goes on: the step is simply not committed
            self.log(f"background save failed: {exc}")
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
        if self._manager is not None:
            self._manager.close()
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
        """True once SIGTERM arrived: commit (step_finished says so), then exit. Several workers: once they agreed
        (a SIGTERM on any of them), at the same step on every worker."""
        if self.workers.multi:
            return self._stop_agreed
        if self._sigterm_at is not None and not self._sigterm_logged:
            self._sigterm_logged = True
            self.log("SIGTERM received: committing the current step (if not committed yet), then exiting")
        return self._sigterm_at is not None

    @property
    def last_committed_step(self) -> int | None:
        """The last step Orbax finalised for this process (a background save counts once it is finished)."""
        self._settle(wait=False)
        return self._last_committed

    def step_finished(self, step: int, loss: float | None = None, **metrics: Any) -> str | None:
        """Record progress of a finished step; return why it must be committed now, or None."""
        self._settle(wait=False)
        self._record_progress(step, loss, metrics)
        if self.workers.multi:
            return self._agreed_reason(step)
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
        state: Any,
        meta: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        reason: str = "",
    ) -> Checkpoint | None:
        """Save ``step`` through the stage's Orbax manager (``force=True``): ``state`` is the pytree of arrays,
        ``meta`` its JSON side (RNG state, data position), ``metrics`` / ``extra`` what the control plane reads
        (the step metadata's custom part). Once Orbax finalised it: answer requests, report notice latency, retain.

        A periodic save with ``async_saves`` returns None at once and is settled when Orbax finishes it in the
        background; any other reason returns the committed checkpoint. A step committed already is kept."""
        self._settle(wait=True)  # one save at a time (Orbax waits too); a finished one is told first
        with self._lock:
            notice_seq, pending = self._notice_seq, set(self._pending)
        started = time.monotonic()
        background = self.async_saves and reason == "periodic"
        result = orbax_io.commit(
            self.store,
            self._manager,
            step,
            state,
            meta=meta,
            metrics=metrics,
            extra=extra,
            reason=reason,
            wait=not background,
            proven_bad=frozenset(self._proven_bad),
            workers=self.workers,
        )
        self._proven_bad.discard(step)
        if result is None:
            self._in_flight = (step, started, reason)
            return None
        elapsed = time.monotonic() - started
        self._commit_seconds = [*self._commit_seconds[-4:], elapsed]
        how = "committed" if result.written else "already committed"
        self.log(f"checkpoint step {step} {how} in {elapsed:.3f}s ({reason or 'request'}) {result.checkpoint.uri}")
        self._committed(step, result.checkpoint, notice_seq, pending)
        return result.checkpoint

    def _settle(self, wait: bool) -> None:
        """Tell a background save's outcome once Orbax finished it (``wait``: block until then). A save that did
        not finalise is said and forgotten: its step is not committed, and the next save proceeds."""
        if self._in_flight is None or self._manager is None:
            return
        if not wait and self._manager.is_saving_in_progress():
            return
        step, started, reason = self._in_flight
        self._in_flight = None
        try:
            self._manager.wait_until_finished()
            checkpoint = orbax_io.committed_result(self.store, step).checkpoint
        except Exception as exc:  # noqa: BLE001 - the step stays uncommitted; training and the next save go on
            self.log(f"background save of step {step} failed: {exc}")
            return
        self.log(
            f"checkpoint step {step} committed in the background in {time.monotonic() - started:.3f}s "
            f"({reason}) {checkpoint.uri}"
        )
        with self._lock:
            handled = self._notice_handled
        self._committed(step, checkpoint, handled, set())

    def _committed(self, step: int, checkpoint: Checkpoint, notice_seq: int, pending: set[str]) -> None:
        """After Orbax finalised ``step``: answer the requests pending when it was asked for, report the notice's
        latency, start a hold when one is due, and ask for retention (after the hold is said, when one starts)."""
        self._last_committed = step
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
            if self._hold_due() or (self.workers.multi and self._agreed_hold_step == step):
                self._hold_committed_step = step
            if step == self.hold_at_step:
                self._drill_hold = step
            holds_next = self._hold_committed_step == step or self._drill_hold == step
        self._set_progress(
            last_checkpoint_step=step,
            last_checkpoint_uri=checkpoint.uri,
            commit_seconds=round(max(self._commit_seconds), 4) if self._commit_seconds else None,
        )
        if holds_next:  # the hold is said first (the control plane may start the window then): see wait_while_held
            self._retention_due = True
        else:
            self._retain()

    def _retain(self) -> None:
        """Ask for retention of older checkpoints; it runs in the background (retention.py), the loop trains on."""
        self._retention_due = False
        if self.workers.primary:
            self._retainer.request()

    def _own_store(self) -> CheckpointStore:
        """This stage's store with a storage client of its own, for a background thread."""
        return CheckpointStore(self.store.bucket_name, self.store.run_key, self.store.stage, client=storage_client())

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
