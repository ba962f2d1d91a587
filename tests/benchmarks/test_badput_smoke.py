"""The badput benchmark end to end at toy size: three rows of the same training on the real local cloud.

Runs ``benchmarks/badput.py`` as a user would (300 steps a row instead of 2,000) and checks its table and
``RESULT`` line against facts the benchmark reads from outside Interlude's report: the final committed step in
GCS, maintenance windows in the local cloud's event log, recomputed steps in the workload's own log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "badput.py"
STEPS = 300

# The Airflow homes it makes copy the suite's migrated DB (dev.DB_TEMPLATE_ENV) instead of migrating their own.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("airflow_db_template")]


def test_three_rows_uninterrupted_interlude_and_naive() -> None:
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--steps",
        str(STEPS),
        "--step-seconds",
        "0.02",
        "--checkpoint-every",
        str(STEPS),  # the naive row then has no periodic checkpoint to resume from: every event recomputes
        "--finetune-steps",
        "2",
        "--event-steps",
        "45,165",
        "--notice",
        "600",  # 1 s at 600x
        "--model-size",
        "tiny",
        "--json",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    out = proc.stdout.splitlines()
    header = next(ln for ln in out if ln.split() == ["uninterrupted", "interlude", "naive"])
    assert header, proc.stdout
    for label in ("overhead per event beyond the downtime", "notice -> committed checkpoint", "badput restore"):
        assert any(ln.lstrip().startswith(label) for ln in out), label
    rows = json.loads(next(ln for ln in out if ln.startswith("RESULT "))[7:])["rows"]
    base, interlude, naive = rows["uninterrupted"], rows["interlude"], rows["naive"]

    assert [r["steps"] for r in rows.values()] == [STEPS] * 3  # every row's final step committed in GCS
    assert base["events"] == 0 and base["steps_recomputed"] == 0 and base["report"]["events"] == 0
    assert interlude["events"] == 2 and naive["events"] == 2  # two windows each in the cloud's own log
    # Interlude: each resume came from a checkpoint committed after the notice, and nothing was computed twice.
    assert interlude["recomputed_per_event"] == [0, 0], interlude
    assert all(t is not None and t > 0 for t in interlude["notice_to_commit_s"]), interlude
    assert interlude["report"]["steps_recomputed"] == 0 and interlude["report"]["events"] >= 2, interlude
    # Naive: no checkpoint before the window, so every step the old boot reached was done again.
    assert all(n >= 40 for n in naive["recomputed_per_event"]), naive
    assert naive["notice_to_commit_s"] == [None, None], naive
    for row in (interlude, naive):
        assert row["train_span_s"] > base["train_span_s"] + row["cloud_downtime_s"], row
        assert row["overhead_per_event_s"] > 0 and 0 < row["goodput_vs_uninterrupted_downtime_aside"] < 1, row
        assert row["badput_s"]["cloud_downtime"] == pytest.approx(row["cloud_downtime_s"], abs=0.01), row
    assert naive["badput_s"]["recomputed_steps"] > 0 == interlude["badput_s"]["recomputed_steps"]
