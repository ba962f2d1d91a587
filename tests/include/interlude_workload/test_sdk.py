"""The SDK from both sides: a user's own loop in-process, and control requests to a running trainer."""

from __future__ import annotations

import contextlib
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.sdk import Checkpointer, weights_digest

from .trainer_proc import start_trainer, trainer_cmd, wait_for_text

REPORTER_NEVER = 3600.0  # progress_seconds: the reporter thread's first turn comes after the test


class _FakeClock:
    """The pacing's clock (``interlude_workload.sdk_holds.time``): it moves only when slept on, so the steps'
    lengths add up exactly (binary fractions) whatever the machine's load. Every read and sleep is counted; a
    loop that reads it without sleeping is stopped after ``spin_limit`` reads (it would never end)."""

    def __init__(self, spin_limit: int = 10_000) -> None:
        self.now, self.reads, self.spin_limit = 0.0, 0, spin_limit
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        self.reads += 1
        if self.reads > self.spin_limit:
            raise AssertionError(f"the clock was read {self.reads} times: a loop that does not sleep")
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    @classmethod
    @contextlib.contextmanager
    def installed(cls, monkeypatch: pytest.MonkeyPatch) -> Iterator[_FakeClock]:
        import interlude_workload.sdk_holds as holds

        clock = cls()
        with monkeypatch.context() as patch:
            patch.setattr(holds, "time", clock)
            yield clock


def _user_loop(
    bucket: str, total: int, stop_after: int | None = None, async_saves: bool = False
) -> tuple[np.ndarray, list[str]]:
    """The README's example loop: a user's own model state, checkpointed through the SDK."""
    reasons: list[str] = []
    with Checkpointer(
        bucket,
        "user-run",
        "train",
        total_steps=total,
        checkpoint_every=4,
        metadata_url=None,
        progress_seconds=0.2,
        async_saves=async_saves,
    ) as ckpt:
        restored = ckpt.start()
        if restored is None:
            weights, rng, start = np.zeros(3), np.random.default_rng(0), 0
        else:
            weights, start = restored.state["weights"], restored.step
            rng = np.random.default_rng()
            rng.bit_generator.state = restored.meta["rng"]
        for step in range(start + 1, total + 1):
            weights = weights + rng.normal(size=3)
            reason = ckpt.step_finished(step, loss=float(np.abs(weights).sum()))
            if reason:
                reasons.append(reason)
                ckpt.commit(step, {"weights": weights}, {"rng": rng.bit_generator.state}, reason=reason)
            if ckpt.stop_requested or step == stop_after:
                break
            ckpt.wait_while_held()
    return weights, reasons


@pytest.mark.parametrize("async_saves", [False, True], ids=["sync", "async-periodic"])
def test_user_loop_resumes_bit_identically_through_the_sdk(bucket: str, async_saves: bool) -> None:
    straight, reasons = _user_loop(bucket, 10, async_saves=async_saves)
    assert reasons == ["periodic", "periodic", "final"]
    store = CheckpointStore(bucket, "user-run", "train")
    assert [s.step for s in store.list() if s.committed] == [4, 8, 10]  # each periodic save finalised too
    store.wipe()
    _user_loop(bucket, 10, stop_after=6, async_saves=async_saves)  # "crash" after step 6: 5 and 6 are lost
    resumed, reasons = _user_loop(bucket, 10, async_saves=async_saves)
    assert reasons == ["periodic", "final"]
    assert weights_digest({"w": resumed}) == weights_digest({"w": straight})
    progress = store.read_progress()
    assert progress["step"] == 10 and progress["total_steps"] == 10 and progress["state"] == "done"
    assert progress["resumed_from"] == 4 and progress["last_checkpoint_step"] == 10


def test_an_async_periodic_save_returns_at_once_and_a_sigterm_save_waits_for_orbax(bucket: str) -> None:
    """With ``async_saves`` a periodic save is Orbax's background save (commit returns None, the step is settled
    later); a save for SIGTERM (or a notice, a request, a hold, the final step) returns only once Orbax finalised
    it, so what is acknowledged or exited on is in GCS."""
    store = CheckpointStore(bucket, "async-run", "train")
    with Checkpointer(
        bucket, "async-run", "train", total_steps=10, checkpoint_every=2, metadata_url=None, async_saves=True
    ) as ckpt:
        ckpt.start()
        assert ckpt.commit(2, {"w": np.full(1 << 16, 2.0)}, {}, reason="periodic") is None
        committed = ckpt.commit(3, {"w": np.full(1 << 16, 3.0)}, {}, reason="sigterm")
        assert committed is not None and committed.step == 3
        listed = {s.step: s.committed for s in store.list()}
        assert listed == {2: True, 3: True}  # the background save of 2 was settled before 3 was saved
        assert ckpt.last_committed_step == 3


def test_control_request_is_answered_within_a_step_and_progress_is_reported(bucket: str, tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    cmd = trainer_cmd(bucket, "ctl", "--step-seconds", "0.1", "--control-poll-seconds", "0.5", steps=500, every=1000)
    proc = start_trainer(cmd, log)
    store = CheckpointStore(bucket, "ctl", "train")
    try:
        wait_for_text(log, "step 10/500", proc)
        time.sleep(1.2)  # let progress.json catch up
        progress = store.read_progress()
        assert progress["total_steps"] == 500 and progress["step"] >= 10 and progress["loss"] > 0
        # A rate, and the time left at that rate; how fast is this machine's business (the pacing has tests of its own).
        assert progress["steps_per_second"] > 0 and progress["eta_seconds"] > 0
        left = (progress["total_steps"] - progress["step"]) / progress["steps_per_second"]
        assert progress["eta_seconds"] == pytest.approx(left, rel=1e-3, abs=0.1), progress
        at_request = max(int(n) for n in re.findall(r"step (\d+)/500", log.read_text()))
        requested = time.monotonic()
        store.request_checkpoint("req-1", reason="test")
        step = None
        while step is None and time.monotonic() - requested < 60:
            step = store.checkpoint_for_request("req-1")
            time.sleep(0.05)
        # Within one control poll (0.5 s) and a step, counted in steps: at 10 steps/s at most, ~6 steps, and fewer
        # when the machine is busy (pacing only slows the trainer); the answer is never an older step.
        assert step is not None and at_request <= step <= at_request + 10, (at_request, step)
        latest = store.latest(verify="full").checkpoint
        assert latest is not None and latest.step == step and latest.extra["reason"] == "control"
        assert store.pending_requests() == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "control request req-1 answered with step" in text
    stored_log = store.read_log()
    assert "control request req-1 answered" in stored_log and "stopped by SIGTERM" in stored_log
    assert store.read_progress()["state"] == "stopped"


def test_hold_margin_grows_with_what_a_checkpoint_really_costs(bucket: str) -> None:
    """With ``hold_margin_commits`` the hold before a window is that many measured checkpoint costs (a step
    plus the slowest recent commit), never less than ``hold_margin_seconds``; the cost is in progress.json."""
    from datetime import timedelta

    with Checkpointer(
        bucket,
        "margin",
        "train",
        total_steps=10,
        checkpoint_every=5,
        metadata_url=None,
        hold_margin_seconds=0.001,
        hold_margin_commits=3.0,
    ) as ckpt:
        ckpt.start()
        assert ckpt.margin() == timedelta(seconds=0.001)  # nothing measured yet: the floor
        ckpt.step_finished(1)
        time.sleep(0.05)
        ckpt.step_finished(2)
        ckpt.commit(2, {"w": np.zeros(3)}, {}, reason="periodic")
        progress = dict(ckpt._progress)
    cost = float(progress["mean_step_seconds"]) + float(progress["commit_seconds"])
    assert progress["commit_seconds"] > 0 and progress["mean_step_seconds"] > 0
    assert ckpt.margin().total_seconds() == pytest.approx(3 * cost, abs=1e-3)


def test_sigterm_while_the_main_thread_is_inside_the_wake_event_does_not_deadlock(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SIGTERM handler runs in the main thread, wherever it is: also inside ``Event.wait``/``clear`` with the
    Event's (non-reentrant) lock held, as in every pacing and hold loop. A handler that took that lock hung the
    trainer until SIGKILL, losing the commit on SIGTERM (seen in benchmarks/badput.py: steps recomputed after a
    maintenance). The handler is called here with the lock held, as the interpreter would; then pacing must end."""
    import threading

    ckpt = Checkpointer(bucket, "sig-run", "train", total_steps=10, checkpoint_every=5, metadata_url=None)

    def signal_arrives_inside_the_event() -> None:
        with ckpt._wake._cond:  # what Event.wait/clear hold while the signal is handled
            ckpt._on_sigterm(signal.SIGTERM, None)

    handler = threading.Thread(target=signal_arrives_inside_the_event, daemon=True)
    handler.start()
    handler.join(timeout=10)
    assert not handler.is_alive(), "the SIGTERM handler blocked on the lock its own thread holds"
    assert ckpt.stop_requested
    with _FakeClock.installed(monkeypatch) as clock:
        ckpt.pace(clock.monotonic(), step_seconds=30.0)  # a long step: SIGTERM ends the pacing within a poll
    assert len(clock.sleeps) <= 1, f"paced on after SIGTERM: {len(clock.sleeps)} sleeps {clock.sleeps[:3]}..."
    ckpt.close()


def test_a_hold_is_in_progress_json_at_once_not_at_the_reporters_next_turn(bucket: str) -> None:
    """The control plane starts a pending maintenance early when it sees the workload hold at a commit, so the
    hold is uploaded when it begins: here the reporter's first turn is an hour away, so a "holding" in GCS (a drill
    hold at step 3) is the hold's own upload; the hold times out after 2 s and the release is uploaded at once too.
    The retention the hold's commit left for the hold (keep=1: step 2 goes) is asked for in it."""
    import threading

    store = CheckpointStore(bucket, "hold-now", "train")
    with Checkpointer(
        bucket,
        "hold-now",
        "train",
        total_steps=5,
        checkpoint_every=100,
        metadata_url=None,
        progress_seconds=REPORTER_NEVER,
        hold_at_step=3,
        max_hold_seconds=2.0,
        keep=1,
    ) as ckpt:
        ckpt.start()
        for step in (1, 2, 3):
            reason = ckpt.step_finished(step)
            if step == 2:
                ckpt.commit(2, {"w": np.ones(3)}, {}, reason="periodic")
        assert reason == "drill-hold"
        ckpt.commit(3, {"w": np.zeros(3)}, {}, reason=reason)
        assert store.read_progress() is None  # nothing uploaded yet: the reporter's first turn is an hour away
        holding = threading.Thread(target=ckpt.wait_while_held)
        holding.start()
        seen: dict = {}
        deadline = time.monotonic() + 120  # a hang guard: with the reporter an hour away, only the hold uploads
        while (seen.get("state"), seen.get("held_at")) != ("holding", 3):
            assert time.monotonic() < deadline, f"the hold never reached GCS before the reporter's turn: {seen}"
            seen = store.read_progress() or {}
            time.sleep(0.05)
        assert (seen.get("state"), seen.get("step"), seen.get("held_at")) == ("holding", 3, 3), seen
        holding.join(timeout=120)
        assert not holding.is_alive()
        released = store.read_progress() or {}  # still before the reporter's first turn: the release's own upload
        assert (released.get("state"), released.get("held_at")) == ("running", None), released
    assert [s.step for s in store.list()] == [3]  # retention runs in the background: done by close at the latest


def test_a_commit_does_not_wait_for_retention_and_close_finishes_it(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention of older checkpoints (a listing, a verify, deletes) runs in a background thread: a commit returns
    while it is still going (here it is held until released), and close() waits for the pass that is due, so a
    finished stage keeps exactly ``keep`` checkpoints. Inline, each commit stopped training for the pass:
    ~0.04 s per commit, two extra commits per maintenance event (benchmarks/README.md)."""
    import threading

    release = threading.Event()
    real_retain = CheckpointStore.retain

    def slow_retain(self: CheckpointStore, keep: int) -> list[int]:
        release.wait(60)
        return real_retain(self, keep)

    monkeypatch.setattr(CheckpointStore, "retain", slow_retain)
    store = CheckpointStore(bucket, "retain-later", "train")
    ckpt = Checkpointer(bucket, "retain-later", "train", total_steps=5, checkpoint_every=1, keep=2, metadata_url=None)
    ckpt.start()

    def train() -> None:
        for step in range(1, 6):
            ckpt.commit(step, {"w": np.full(3, step)}, {}, reason=ckpt.step_finished(step) or "")

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    trainer.join(timeout=60)
    finished_while_retention_waited = not trainer.is_alive()
    release.set()
    assert finished_while_retention_waited, "a commit waited for retention"
    assert [s.step for s in store.list()][-1] == 5
    ckpt.close()
    assert [s.step for s in store.list()] == [4, 5]


def test_pacing_sleeps_through_a_maintenance_notice_instead_of_spinning(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notice sets the Checkpointer's wake event and only a hold clears it. Pacing waited on that event, so from
    a notice to the hold each wait returned at once and a step's pacing spun a core (a maintenance notice is an
    hour on Google). Under a notice, each paced step is sleeps that add up to the step, and the clock is read only
    around them: on a clock that moves only when slept on, a loop that does not sleep reads it without end."""
    from interlude_workload.maintenance import Notice

    step = 1 / 64
    ckpt = Checkpointer(bucket, "pace-run", "train", total_steps=100, checkpoint_every=100, metadata_url=None)
    ckpt._on_notice(Notice(maintenance_event="TERMINATE_ON_HOST_MAINTENANCE"))
    assert ckpt._wake.is_set()  # what a waiting pacer would have returned on at once
    with _FakeClock.installed(monkeypatch) as clock:
        for _ in range(50):
            ckpt.pace(clock.monotonic(), step_seconds=step)
    ckpt.close()
    assert clock.now == 50 * step and clock.sleeps == [step] * 50, clock.sleeps[:5]  # the steps were slept
    assert clock.reads <= 4 * 50, f"{clock.reads} clock reads for 50 steps: a loop ran without sleeping"


def test_a_late_wake_up_is_taken_off_the_next_steps_sleep(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sleep ends 1/128 s late (a loaded host): paced steps keep their length on average (a step stands for
    an accelerator's compute), where carrying nothing made each of them that much longer. On a clock of its own
    (binary fractions, so the sums are exact): the real clock on a busy machine adds lateness of its own."""
    import interlude_workload.sdk_holds as holds

    step, late = 1 / 16, 1 / 128

    class Clock:
        now = 0.0

        @classmethod
        def monotonic(cls) -> float:
            return cls.now

        @classmethod
        def sleep(cls, seconds: float) -> None:
            cls.now += seconds + late

    ckpt = Checkpointer(bucket, "pace-late", "train", total_steps=100, checkpoint_every=100, metadata_url=None)
    monkeypatch.setattr(holds, "time", Clock)
    for _ in range(20):
        ckpt.pace(Clock.monotonic(), step_seconds=step)
    monkeypatch.undo()
    ckpt.close()
    # only the last step's lateness stays; carrying nothing would make it 20 * (step + late)
    assert Clock.now == 20 * step + late, f"20 steps of {step} s took {Clock.now} s"


def test_a_step_whose_own_work_overran_is_not_made_up_later(bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only oversleep is carried: a step whose work took 3/64 s of a 2/64 s budget sleeps nothing, and no later
    step is shortened to catch up (that would hide time the workload really spent). On a clock of its own: the
    steps' lengths add up exactly."""
    step, work = 2 / 64, 3 / 64
    ckpt = Checkpointer(bucket, "pace-overrun", "train", total_steps=100, checkpoint_every=100, metadata_url=None)
    with _FakeClock.installed(monkeypatch) as clock:
        for i in range(20):
            started = clock.monotonic()
            if i % 2 == 0:
                clock.now += work  # this step's own work
            ckpt.pace(started, step_seconds=step)
    ckpt.close()
    assert clock.sleeps == [step] * 10, f"some overrun was made up by shorter steps: {clock.sleeps}"
    assert clock.now == 10 * work + 10 * step
