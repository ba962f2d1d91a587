"""The Checkpointer's holds and pacing: no stepping right before a maintenance window (or at a drill's step), so no
step is computed twice, and steps paced to a fixed length. A mixin of interlude_workload.sdk.Checkpointer: it uses
the Checkpointer's lock, store, notice state and reporting."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any


class Holding:
    """Holds before maintenance and drill holds of one Checkpointer (see interlude_workload.sdk.Checkpointer)."""

    store: Any
    hold_margin: timedelta
    hold_margin_commits: float
    max_hold_seconds: float
    _lock: Any
    _wake: Any
    _closing: Any
    _notice: Any
    _notice_seq: int
    _notice_handled: int
    _hold_committed_step: int | None
    _hold_timed_out_seq: int
    _drill_hold: int | None
    _drill_notice_seen: bool
    _last_committed: int | None
    _pending: set[str]
    _acked: set[str]
    _commit_seconds: list[float]
    _progress: dict[str, Any]
    _pace_late: float
    _retention_due: bool
    workers: Any
    _agreed_hold_step: int | None
    _hold_tick: Any  # interlude_workload.sdk_workers.Workers._hold_tick (a later base of the Checkpointer)

    def wait_while_held(self) -> None:
        """Block while a maintenance window is imminent, or at the drill step, and this step is committed.

        Returns when the notice clears (training continues), when a drill's maintenance passed without
        a restart, after ``max_hold_seconds``, or on SIGTERM (the loop then sees :attr:`stop_requested`;
        its step is already committed, so nothing is lost). Control requests that arrive meanwhile are
        answered with the held step: it is the state the workload will resume from.
        """
        multi = self.workers.multi
        with self._lock:
            committed = self._last_committed
            if multi:  # what every worker agreed at this step, not this worker's own notice
                notice_hold = committed is not None and self._agreed_hold_step == committed
            else:
                notice_hold = self._hold_due() and self._hold_committed_step == committed
            drill_hold = self._drill_hold is not None and self._drill_hold == committed
        if not (notice_hold or drill_hold):
            return
        what = (
            f"maintenance near ({self._notice.describe() if self._notice.active else 'on another worker'})"
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
            if multi:  # every worker releases (or stops) at the same tick
                reason = self._hold_tick(deadline, time.monotonic())
                self._agreed_hold_step = None
            else:
                with self._lock:
                    reason = self._release_reason(deadline)
            if reason == "stop":
                break
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
