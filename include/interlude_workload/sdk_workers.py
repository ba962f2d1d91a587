"""The Checkpointer on a slice of several workers: one worker's notice, request or SIGTERM is every worker's save.

A mixin of :class:`interlude_workload.sdk.Checkpointer`. With one worker none of this runs. With several, the
training step is a collective (every worker must run every step), so a worker that committed, held or stopped
alone would leave the others waiting in the next step's all-reduce. Every such decision is therefore taken in an
agreement round (:func:`interlude_workload.distributed.agree`: each worker's local reasons as bits, everyone gets
their OR), once per step in :meth:`step_finished` and once per tick of a hold:

* a maintenance notice from *this* worker's metadata server (each TPU VM of a slice has its own), a control-plane
  request (polled by worker 0 only) and a SIGTERM (this worker's own handler) become the same commit of the same
  step on every worker, and SIGTERM the same exit after it;
* JAX's preemption sync point (Orbax's ``CheckpointManager.reached_preemption(step)``, i.e.
  ``multihost_utils.reached_preemption_sync_point``, which Orbax's ``save`` asks as well) is asked at every step
  too: JAX's own SIGTERM notifier (installed by ``jax.distributed.initialize``) owns the signal until the SDK's
  handler replaces it at the top of :meth:`start`, and a SIGTERM it caught in those milliseconds stops every worker
  at the step JAX's protocol agreed on (the fastest worker's last step + 1; a run resumed past that step misses it:
  JAX's limit, and the reason the SDK's own handler and the agreement round carry SIGTERM everywhere else);
* a hold before a maintenance window (or at a drill's step) holds every worker at the same committed step, and is
  released when no worker has a reason left to hold (or any worker's hold timed out, or any got SIGTERM).

Only worker 0 writes the stage's shared files (progress.json, retention, answers to control requests); every worker
writes its own log chunks and Orbax writes the step (its primary host the step's metadata and commit marker).
"""

from __future__ import annotations

from typing import Any

from interlude_workload import distributed

STOP = 1  # SIGTERM on some worker (or JAX's preemption sync point): commit this step and exit
NOTICE = 2  # a new maintenance notice on some worker: commit now
CONTROL = 4  # a control-plane checkpoint request (worker 0 polls them): commit now
HOLD = 8  # some worker's maintenance window is near: commit and hold
TIMEOUT = 16  # some worker held max_hold_seconds: release
ACTIVE = 32  # some worker has an active notice (a drill's maintenance is under way)


class Workers:
    """Agreement rounds of one Checkpointer (see interlude_workload.sdk.Checkpointer)."""

    workers: distributed.Workers
    total_steps: int
    checkpoint_every: int
    hold_at_step: int | None
    max_hold_seconds: float
    _lock: Any
    _manager: Any
    _notice: Any
    _notice_seq: int
    _notice_handled: int
    _pending: set[str]
    _sigterm_at: float | None
    _stop_agreed: bool
    _agreed_hold_step: int | None
    _hold_timed_out_seq: int
    _drill_hold: int | None
    _drill_notice_seen: bool

    def log(self, message: str) -> None:
        raise NotImplementedError

    def _hold_due(self) -> bool:
        raise NotImplementedError

    def _agreed_reason(self, step: int) -> str | None:
        """The reason to commit ``step``, the same on every worker (one agreement round)."""
        with self._lock:
            local = (STOP if self._sigterm_at is not None else 0) | (HOLD if self._hold_due() else 0)
            local |= NOTICE if self._notice_seq > self._notice_handled else 0
            local |= CONTROL if self._pending else 0
        agreed = distributed.agree(local)
        if self._manager is not None and self._manager.reached_preemption(step):
            agreed |= STOP  # JAX's sync point: True at this step on every worker
        if agreed & STOP and not self._stop_agreed:
            self._stop_agreed = True
            who = "this worker" if local & STOP else "another worker"
            self.log(f"SIGTERM on {who}: every worker commits step {step}, then exits")
        if agreed & NOTICE and not local & NOTICE:
            self.log(f"another worker has a maintenance notice: every worker commits step {step}")
        self._agreed_hold_step = step if agreed & HOLD else None
        if agreed & STOP:
            return "sigterm"
        if step >= self.total_steps:
            return "final"
        for bit, reason in ((NOTICE, "notice"), (CONTROL, "control"), (HOLD, "maintenance-hold")):
            if agreed & bit:
                return reason
        if step == self.hold_at_step:
            return "drill-hold"
        if step % self.checkpoint_every == 0:
            return "periodic"
        return None

    def _agree_on_resume(self, restored: Any) -> None:
        """Several workers: every one restored the same step (each read the listing itself), or none trains."""
        if not self.workers.multi:
            return
        steps = distributed.gather(restored.step if restored is not None else 0)
        if len(set(steps)) != 1:
            raise RuntimeError(f"the workers found different resume points {steps}: restart the slice")

    def _hold_tick(self, deadline: float, now: float) -> str | None:
        """One agreement round of a hold: why every worker releases it now ("stop" on SIGTERM), or None."""
        with self._lock:
            local = (STOP if self._sigterm_at is not None else 0) | (TIMEOUT if now >= deadline else 0)
            local |= (ACTIVE if self._notice.active else 0) | (HOLD if self._hold_due() else 0)
        agreed = distributed.agree(local)
        with self._lock:
            if agreed & STOP:
                self._stop_agreed = True
                return "stop"
            if agreed & TIMEOUT:
                self._hold_timed_out_seq = self._notice_seq  # train on until a new notice arrives
                self._drill_hold = None
                return f"held {self.max_hold_seconds:.0f}s on some worker and the slice is still up"
            if self._drill_hold is not None:
                if agreed & ACTIVE:
                    self._drill_notice_seen = True
                    return None
                if self._drill_notice_seen:
                    self._drill_hold = None
                    return "the drill's maintenance passed without a restart"
                return None
            if not agreed & HOLD:
                return "notice cleared" if not agreed & ACTIVE else "window not near yet"
        return None
