"""The badput benchmark's reading of a workload log and the cloud's events (pure: a made-up timeline in)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from benchmarks.badput_facts import run_facts

T0 = 1_800_000_000.0
MACHINE = "tpu-us-central1-a-run-tpu"


def _line(at: float, text: str) -> str:
    stamp = datetime.fromtimestamp(T0 + at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{stamp} [run/train] {text}"


def _event(at: float, kind: str) -> dict[str, object]:
    return {"t": T0 + at, "event": kind, "machine": MACHINE}


def test_one_event_read_from_the_log_and_the_cloud() -> None:
    """Notice at 1 s, commit at notice 1.05, trains to step 30, window 2-3 s, new boot steps again at 4.5 s from
    step 20 (its last commit before the window); the console copy repeats lines (counted once)."""
    log = [
        _line(0.0, "training train steps 1..40 on 1200 rows"),
        _line(1.0, "step 10/40 loss 0.1"),
        _line(1.05, "checkpoint step 10 committed in 0.030s (notice) gs://b/x/step-10/"),
        _line(1.5, "checkpoint step 20 committed in 0.040s (periodic) gs://b/x/step-20/"),
        _line(1.9, "step 30/40 loss 0.1"),
        _line(4.4, "resume point: step 20 (gs://b/x/step-20/)"),
        _line(4.5, "training train steps 21..40 on 1200 rows"),
        _line(6.0, "checkpoint step 40 committed in 0.050s (final) gs://b/x/step-40/"),
    ]
    console = "\n".join(["startup: begin", *log[3:]])  # unstamped and repeated lines
    events = [_event(1.0, "maintenance_notice"), _event(2.0, "maintenance_start"), _event(3.0, "maintenance_end")]
    facts = run_facts(
        "\n".join(log) + "\n" + console, [*events, {"t": T0, "event": "x", "machine": "other"}], MACHINE, 40
    )
    assert facts.span_s == pytest.approx(6.0, abs=0.01) and facts.downtime_s == pytest.approx(1.0)
    (event,) = facts.events
    assert (event.resume_step, event.reached_step, event.recomputed_steps) == (20, 30, 10)
    assert event.notice_to_first_commit_s == pytest.approx(0.05, abs=0.01)
    assert event.notice_to_commit_s == pytest.approx(0.5, abs=0.01) and event.checkpoint_write_s == 0.04
    wall, productive, badput = facts.badput(step_seconds=0.1)
    assert badput.cloud_downtime == pytest.approx(1.0) and badput.restore == pytest.approx(1.5, abs=0.01)
    assert badput.recomputed_steps == pytest.approx(1.0) and productive == pytest.approx(4.0)


def test_unpaired_maintenance_events_are_an_error_not_a_guess() -> None:
    log = "\n".join(
        [_line(0, "training train steps 1..10 on 1 rows"), _line(1, "checkpoint step 10 committed in 0.01s (final) u")]
    )
    with pytest.raises(ValueError, match="unpaired"):
        run_facts(log, [_event(0.5, "maintenance_notice")], MACHINE, 10)
