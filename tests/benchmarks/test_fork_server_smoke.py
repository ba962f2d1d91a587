"""benchmarks/fork_server.py runs as a user runs it and its figures are facts it measured: one boot each way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fork_server_benchmark_boots_each_way_and_reports_the_zygote() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fork_server.py"), "--boots", "1", "--json"],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout[: out.stdout.rindex("}") + 1])
    assert summary["cold"]["boots"] == summary["forked"]["boots"] == 1, summary
    assert summary["cold"]["cpu_s_median"] > 0 and summary["forked"]["cpu_s_median"] > 0, summary
    assert summary["zygote"]["cpu_s"] > 0, summary
    assert "goal: a forked boot's machine CPU" in out.stdout
