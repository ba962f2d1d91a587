"""The restore probe end to end at toy size: one checkout, one start each way, as a user runs it, held to its goal.

The restore is part of the badput goal's "overhead per event beyond the downtime < 3 s" (benchmarks/README.md).
Its wall time swings with the machine's load; its CPU (the kernel's count for the agent and its trainer, which
the probe reads from /proc) does not grow with waiting, and it is a floor of the wall time on any machine: a
restore whose CPU alone took a third of the per-event budget would leave too little for the checkpoint commit
and the wait for the window. So the bound is on CPU. Measured: 260-425 ms with Interlude's npz checkpoints, 2.1 s
since checkpoints are Orbax's (2026-12-05, tensorstore/gcsfs/CheckpointManager set-up in the trainer: issue 31
records the regression). The goal itself (the whole 3 s per-event budget) is the benchmark's to judge: it prints
whether the restore's CPU meets it. CPU does grow with a busy machine all the same (3.35 s at load 12 on 2 cores,
1.85 s idle), so this test holds only a bound no load explains: RESTORE_CPU_SANITY_MS, ten times an idle restore.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "restore_probe.py"
RESTORE_CPU_SANITY_MS = 20_000.0  # a gross regression (see the docstring); the goal is the benchmark's
LINE = re.compile(r"^(agent|boot)\s+this\s+-> training: median\s+([\d.]+) ms .*CPU median\s+([\d.]+) ms$", re.M)


def test_one_start_each_way_reaches_training_and_leaves_no_workload_behind(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--starts", "1", f"this={ROOT}"],
        capture_output=True, text=True, timeout=300, env={**_env(), "TMPDIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    found = {mode: (float(took), float(cpu)) for mode, took, cpu in LINE.findall(done.stdout)}
    assert set(found) == {"agent", "boot"}, done.stdout
    for took, cpu in found.values():
        assert 0 < took < 60_000 and 0 < cpu <= RESTORE_CPU_SANITY_MS, done.stdout
    assert re.search(r"^goal: restore CPU .* (met|NOT met)", done.stdout, re.M), done.stdout
    left = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(
        p.info["cmdline"] or [])]  # fmt: skip
    assert not left, left


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
