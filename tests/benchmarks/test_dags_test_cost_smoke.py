"""The cold-vs-warm `dags test` benchmark end to end, one run of each: both runs succeed (the benchmark refuses a
run without the plan's line), every figure it prints is a measured one, and the warm run meets the goal.

The goal (benchmarks/README.md, `dags_test_cost.py`): a warm run costs a fraction of a cold one (~4 against ~14
CPU-s), so the warm server pays for itself within a couple of runs. Asserted as a ratio of the kernel's CPU counts
of the two runs, made side by side in one benchmark: waiting on a busy machine adds wall time, not CPU seconds,
and what contention does add (colder caches) it adds to both runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WARM_SHARE_MAX = 0.5  # README: 4.21 / 14.24 = 0.30 on a quiet machine; a warm run that imports Airflow itself is ~0.9
PAYS_BACK_WITHIN_RUNS = 2.0  # README: "the server's start pays for itself after 0.8 runs"

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "dags_test_cost.py"

# The Airflow homes it makes copy the suite's migrated DB (dev.DB_TEMPLATE_ENV) instead of migrating their own.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("airflow_db_template")]


def test_one_cold_and_one_warm_plan_only_run_side_by_side() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1", "--json"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    rows = {row["name"]: row for row in json.loads(result.removeprefix("RESULT "))}
    assert set(rows) == {"warm server start (once per worker)", "dags test, cold", "dags test, warm"}
    for row in rows.values():
        assert row["runs"] == 1 and len(row["cpu_s"]) == len(row["wall_s"]) == 1, row
        assert row["cpu_s"][0] > 0 and row["wall_s"][0] > 0, row
    for name in rows:
        assert name in done.stdout  # the table shows each row
    cold, warm = rows["dags test, cold"]["cpu_s"][0], rows["dags test, warm"]["cpu_s"][0]
    server = rows["warm server start (once per worker)"]["cpu_s"][0]
    assert warm <= WARM_SHARE_MAX * cold, f"warm {warm:.2f} CPU-s against cold {cold:.2f}: the server saves too little"
    assert server <= PAYS_BACK_WITHIN_RUNS * (cold - warm), f"server start {server:.2f} CPU-s, saved {cold - warm:.2f}"
