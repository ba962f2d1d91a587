"""The suite's xdist grouping (tests/xdist_scheduling.py), checked without starting workers, and once with them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.xdist_scheduling import (
    LONG_UNITS,
    STACK_TEST_SECONDS,
    UNKNOWN_TEST_SECONDS,
    plan_stack_shards,
    run_order,
    stack_shards,
    unit_of,
)

ROOT = Path(__file__).resolve().parents[1]
STACK = [f"tests/e2e/test_stack.py::{name}" for name in STACK_TEST_SECONDS]


@pytest.mark.parametrize("shards", [1, 2, 3, 4])
def test_every_stack_test_gets_one_shard_and_the_shards_are_balanced(shards: int) -> None:
    plan = plan_stack_shards(STACK, shards)
    assert sorted(plan) == sorted(STACK) and set(plan.values()) <= set(range(shards))
    load = [sum(STACK_TEST_SECONDS[n.split("::")[-1]] for n in STACK if plan[n] == s) for s in range(shards)]
    # Longest-first onto the least loaded: no shard exceeds another by more than its longest test.
    assert max(load) - min(load) <= max(STACK_TEST_SECONDS.values()), load


def test_an_unknown_stack_test_counts_as_a_minute_and_the_plan_is_the_same_on_every_call() -> None:
    nodeids = [*STACK, "tests/e2e/test_zz_new.py::test_new"]
    first = plan_stack_shards(nodeids, 2)
    assert first == plan_stack_shards(list(nodeids), 2)
    assert UNKNOWN_TEST_SECONDS == 60.0 and "tests/e2e/test_zz_new.py::test_new" in first


def test_units_stack_shard_per_test_end_to_end_whole_files_and_other_files() -> None:
    plan = {"tests/e2e/test_stack.py::test_a": 1}
    assert unit_of("tests/e2e/test_stack.py::test_a", plan) == "stack-1"
    lifecycle = "tests/e2e/test_lifecycle_runs.py::test_x"
    assert unit_of(lifecycle, plan) == lifecycle
    assert unit_of("tests/faults/test_failover.py::test_y[p]", plan) == "tests/faults/test_failover.py::test_y[p]"
    assert unit_of("tests/e2e/test_serving_dag.py::test_z", plan) == "tests/e2e/test_serving_dag.py"
    assert (
        unit_of("tests/plugins/interlude/training/test_spec.py::test_w[1]", plan)
        == "tests/plugins/interlude/training/test_spec.py"
    )


def test_shards_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_STACK_SHARDS", raising=False)
    assert stack_shards() == 2
    monkeypatch.setenv("TEST_STACK_SHARDS", "1")
    assert stack_shards() == 1
    monkeypatch.setenv("TEST_STACK_SHARDS", "0")
    assert stack_shards() == 1


def test_real_workers_run_each_unit_whole_on_one_worker(tmp_path: Path) -> None:
    """Three real xdist workers plan (not run) the stack's tests and two whole files: each stack shard and each
    whole file lands on exactly one worker, both shards are used, and the stack's tests come first."""
    plugin = tmp_path / "where_ran.py"
    record = tmp_path / "ran.txt"
    plugin.write_text(
        "import os\n"
        "def pytest_runtest_logstart(nodeid, location):\n"
        "    if os.environ.get('PYTEST_XDIST_WORKER'):\n"
        f"        with open({str(record)!r}, 'a') as f:\n"
        "            f.write(os.environ['PYTEST_XDIST_WORKER'] + ' ' + nodeid + '\\n')\n"
    )
    command = [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "--setup-plan", "-q"]
    command += ["-p", "where_ran", "-p", "no:cacheprovider", "tests/plugins/interlude/training/test_spec.py"]
    command += ["tests/e2e/test_serving_dag.py", "tests/e2e/test_stack.py", "tests/e2e/test_zz_browser.py"]
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "TEST_STACK_SHARDS": "2"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ran = [line.split(" ", 1) for line in record.read_text().splitlines()]
    workers_of: dict[str, set[str]] = {}
    for worker, nodeid in ran:
        path = nodeid.split("::")[0]
        if path in ("tests/e2e/test_serving_dag.py", "tests/plugins/interlude/training/test_spec.py"):
            workers_of.setdefault(path, set()).add(worker)
    assert set(workers_of) == {"tests/e2e/test_serving_dag.py", "tests/plugins/interlude/training/test_spec.py"}
    stack_workers = {w for w, n in ran if n.startswith(("tests/e2e/test_stack.py", "tests/e2e/test_zz_"))}
    assert len(stack_workers) == 2, stack_workers
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    for worker in stack_workers:
        mine = [n for w, n in ran if w == worker]
        stack_count = sum(n.startswith(("tests/e2e/test_stack.py", "tests/e2e/test_zz_")) for n in mine)
        first = mine[:stack_count]
        assert all(n.startswith(("tests/e2e/test_stack.py", "tests/e2e/test_zz_")) for n in first), mine


def test_run_order_stack_shards_then_long_units_then_the_rest_each_unit_together() -> None:
    collected = [
        "tests/dags/test_dag_integrity.py::test_a",
        "tests/e2e/test_serving_dag.py::test_one",
        "tests/e2e/test_stack.py::test_x",
        "tests/e2e/test_serving_dag.py::test_two",
        "tests/benchmarks/test_badput_smoke.py::test_three_rows_uninterrupted_interlude_and_naive",
        "tests/plugins/interlude/training/test_spec.py::test_b",
    ]
    order = run_order(collected, {"tests/e2e/test_stack.py::test_x": 0})
    assert order == [
        "tests/e2e/test_stack.py::test_x",
        "tests/e2e/test_serving_dag.py::test_one",  # 340 s
        "tests/e2e/test_serving_dag.py::test_two",
        "tests/benchmarks/test_badput_smoke.py::test_three_rows_uninterrupted_interlude_and_naive",  # 265 s
        "tests/dags/test_dag_integrity.py::test_a",
        "tests/plugins/interlude/training/test_spec.py::test_b",
    ]
    for unit in LONG_UNITS:  # each names a test file, or a test in one, that exists (else it orders nothing)
        path, _, name = unit.partition("::")
        assert (ROOT / path).is_file(), unit
        assert not name or f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), unit
