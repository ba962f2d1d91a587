"""The triggerer benchmark end to end at toy size: 20 StageTriggers (and the floor's 20 of Airflow's
DateTimeTrigger) really run in a real triggerer.

Runs ``benchmarks/triggerer_watch.py`` as a user would and checks its ``RESULT`` line: every trigger
polled, the TPU API and GCS were called from the triggerer, no trigger fired (all task instances still
deferred), and nothing the benchmark started outlives it.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "triggerer_watch.py"

# The Airflow homes it makes copy the suite's migrated DB (dev.DB_TEMPLATE_ENV) instead of migrating their own.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("airflow_db_template")]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if text in " ".join(p.info["cmdline"] or []) or text in p.environ().get("AIRFLOW_HOME", ""):
                found.append(f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def most_shared_lists_per_min(result: dict[str, Any]) -> float:
    """The most listings the shared design can make in the measured window, whatever the load: two (one per glob)
    per refresh, a refresh at most every 0.9 poll intervals (the shared cache's max age, triggers/stage.py), and one
    more refresh than fits whole, as a window's edges can catch one. Per trigger it would be 20 times as many.

    (The bound was 2 per poll interval plus 4 a minute, 64: an 8 s window that holds five refreshes reads 75 a minute,
    and a loaded machine showed 71.3 with nothing wrong.)"""
    window, interval = result["window_s"], result["poll_interval_s"]
    refreshes = math.floor(window / (0.9 * interval)) + 1
    return 2 * refreshes * 60 / window


def test_twenty_triggers_poll_in_a_real_triggerer_floor_before_after_and_a_git_ref() -> None:
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--machines",
        "20",
        "--seconds",
        "6",
        "--poll-interval",
        "2",
        "--idle-seconds",
        "2",
        "--settle",
        "1",
        "--gcs-state",
        "checkpoint",
        "--startup-timeout",
        "60",
        "--design",
        "floor,before,after,main",
        "--main-ref",
        "HEAD",  # the "main" design: interlude exported from a git ref (main in a real run; any ref works)
        "--steady-at",
        "12",
        "--steady-seconds",
        "4",
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=900, cwd=ROOT
    )  # a guard, not a goal: 320 s seen under the full suite
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    floor, before, after, main = json.loads(line.removeprefix("RESULT "))["designs"]
    assert (floor["design"], before["design"], after["design"], main["design"]) == ("floor", "before", "after", "main")
    assert "design 'main': interlude from git ref 'HEAD'" in proc.stderr
    # The floor: Airflow's own DateTimeTrigger in the same 20 deferred instances, logging and sleeping.
    assert floor["triggers_polled"] == 20 and floor["task_instance_states"] == {"deferred": 20}
    assert floor["calls_per_min"] == {}

    for result in (before, after, main, after["steady"], main["steady"]):
        assert result["triggers_polled"] == 20
        assert result["task_instance_states"] == {"deferred": 20}
        calls = result["calls_per_min"]
        assert calls.get("tpu.GET.nodes", 0) > 0  # the shared per-zone list ran in the triggerer
        assert calls.get("gcs.list_objects", 0) > 0  # and so did the GCS reads
        # One list per zone and interval, shared by all 20 triggers: far fewer TPU calls than polls.
        assert result["tpu_api_calls_per_min"] < result["expected_polls_per_trigger_per_min"] * 20
        assert result["cpu_pct"] > 0 and result["idle"]["rss_mb"] > 0
    # Before: each trigger lists its stage and downloads progress, manifest and COMMITTED itself.
    assert before["gcs_calls_per_trigger_per_min"] >= 1
    # After: two shared lists per interval for the whole bucket, and nothing changed, so no downloads.
    assert after["calls_per_min"].get("gcs.download", 0) == 0
    assert after["gcs_lists_per_min"] <= most_shared_lists_per_min(after)
    assert after["gcs_calls_per_min"] * 5 < before["gcs_calls_per_min"]
    # The steady-state window: measured later in the same triggerer, as long as asked.
    assert after["steady"]["window_start_s"] >= 12 and after["steady"]["window_s"] >= 4
    assert "steady state" in proc.stdout

    work = re.search(r"work dir (\S+)", proc.stderr)
    assert work is not None
    assert not Path(work.group(1)).exists()
    assert _processes_mentioning(work.group(1)) == []


def test_training_stages_rewriting_their_progress_cost_the_shared_design_no_download() -> None:
    """``--gcs-state training``: every stage's progress.json rewritten between two polls, as running workloads
    do. The per-stage design downloads each new progress; the shared listing carries it (the metadata copy the
    workload writes), so no stage makes a GCS call of its own. Calls counted by the benchmark's proxy."""
    cmd = [
        sys.executable,
        str(SCRIPT),
        *("--machines", "20", "--seconds", "8", "--poll-interval", "2", "--idle-seconds", "2", "--settle", "1"),
        *("--gcs-state", "training", "--startup-timeout", "60", "--design", "before,after"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    before, after = json.loads(line.removeprefix("RESULT "))["designs"]
    for result in (before, after):
        assert result["triggers_polled"] == 20 and result["task_instance_states"] == {"deferred": 20}
        # Every stage rewritten about once per poll interval (2 s) during the window: ~600 a minute.
        assert result["progress_writes_per_min"] >= 0.5 * 20 * 60 / 2, result["progress_writes_per_min"]
    # Before: each trigger reads its stage itself (every third poll while calm: progress, manifest, COMMITTED);
    # after: the listings alone, although every listing shows 20 new progress generations.
    assert before["calls_per_min"].get("gcs.download", 0) >= 0.5 * 20 * (60 / 2) / 3
    assert after["calls_per_min"].get("gcs.download", 0) == 0
    assert 0 < after["gcs_lists_per_min"] <= most_shared_lists_per_min(after)
    work = re.search(r"work dir (\S+)", proc.stderr)
    assert work is not None and _processes_mentioning(work.group(1)) == []


def test_a_sigterm_mid_run_stops_everything_the_benchmark_started() -> None:
    """A benchmark stopped with `kill` leaves no triggerer, trigger runner, proxy or local cloud behind (they run
    in sessions of their own, so only the benchmark's own cleanup can stop them)."""
    cmd = [
        sys.executable,
        str(SCRIPT),
        *("--machines", "5", "--seconds", "120", "--poll-interval", "2", "--idle-seconds", "1", "--settle", "1"),
        *("--startup-timeout", "60", "--design", "after"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "measuring for" in line:
            break
    else:
        pytest.fail("".join(lines)[-3000:])
    work = re.search(r"work dir (\S+)", "".join(lines))
    assert work is not None
    assert _processes_mentioning(work.group(1))  # the triggerer and the local cloud are up
    proc.terminate()
    assert proc.wait(timeout=120) == 128 + 15
    assert _processes_mentioning(work.group(1)) == []
    assert not Path(work.group(1)).exists()
