"""Machine slots against the real GCS emulator: `ifGenerationMatch=0` lets exactly one writer take a slot."""

from __future__ import annotations

import threading

import pytest

from interlude.machines import slots as machine_slots


def test_at_most_cap_runs_hold_a_slot_and_taking_again_is_idempotent(bucket: str) -> None:
    assert machine_slots.take(bucket, "run-a", "d", "a", cap=2) == 0
    assert machine_slots.take(bucket, "run-b", "d", "b", cap=2) == 1
    assert machine_slots.take(bucket, "run-c", "d", "c", cap=2) is None  # both held by others
    assert machine_slots.take(bucket, "run-a", "d", "a", cap=2) == 0  # a retry of run-a keeps its slot
    assert [s.run_key for s in machine_slots.holders(bucket)] == ["run-a", "run-b"]
    assert machine_slots.release(bucket, "run-a") == [0]
    assert machine_slots.release(bucket, "run-a") == []  # nothing left to free
    assert machine_slots.take(bucket, "run-c", "d", "c", cap=2) == 0
    assert {s.run_key for s in machine_slots.holders(bucket)} == {"run-b", "run-c"}


def test_racing_runs_never_share_a_slot(bucket: str) -> None:
    won: dict[str, int | None] = {}
    start = threading.Barrier(8)

    def race(run: str) -> None:
        start.wait()
        won[run] = machine_slots.take(bucket, run, "d", run, cap=3)

    threads = [threading.Thread(target=race, args=(f"run-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = {run: slot for run, slot in won.items() if slot is not None}
    assert len(winners) == 3 and sorted(winners.values()) == [0, 1, 2], won
    assert {s.run_key for s in machine_slots.holders(bucket)} == set(winners)


@pytest.mark.parametrize(("value", "cap"), [("2", 2), ("0", 0), ("nope", 0), (None, 0)])
def test_the_cap_is_the_deployments_setting(monkeypatch: pytest.MonkeyPatch, value: str | None, cap: int) -> None:
    if value is None:
        monkeypatch.delenv("AIRFLOW__INTERLUDE__MAX_MACHINES", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW__INTERLUDE__MAX_MACHINES", value)
    assert machine_slots.max_machines() == cap
