"""The cold-vs-warm `dags test` benchmark end to end, one run of each: both runs succeed (the benchmark refuses a
run without the plan's line), and every figure it prints is a measured one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
