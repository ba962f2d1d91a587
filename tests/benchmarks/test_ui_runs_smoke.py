"""The Runs-page benchmark end to end with a few runs: the real api-server app mounts the plugin, the page shows
every seeded run (counted in its HTML), both the page and the baseline answer, and the figures it prints are the
measured ones. No timing is asserted (a busy machine must not fail it): the 1 s goal is the benchmark's verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "ui_runs.py"

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("airflow_db_template")]


def test_the_runs_page_shows_every_seeded_run_and_both_pages_are_timed() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "6", "--repeat", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["runs"] == 6 and result["rows_shown"] == 6, result
    for key in ("page", "baseline"):
        row = result[key]
        assert row["requests"] == 2 and 0 < row["median_s"] <= row["max_s"] and row["bytes"] > 0, row
    assert result["page"]["path"] == "/interlude/runs"
    assert f"{result['page']['median_s']:.3f}s" in done.stdout  # the table prints the figure it measured
    assert "goal: the Runs page answers in under 1 s with 6 runs" in done.stdout
