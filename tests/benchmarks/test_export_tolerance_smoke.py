"""The export-tolerance benchmark as a user runs it, at a toy size: it trains, measures correct and broken exports
with the product's own check (llm.export.logits_problem), and its verdict line says the bound separates them.

The figures at the default size (the small model through 5,000 steps) are in include/interlude_workload/README.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "export_tolerance.py"


def test_correct_exports_pass_and_broken_ones_are_refused_at_a_toy_size() -> None:
    args = ["--sizes", "tiny", "--steps", "30", "--finetune-steps", "5", "--at", "0,30", "--json"]
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    body, verdict = done.stdout.rsplit("\n", 2)[0], done.stdout.strip().splitlines()[-1]
    assert verdict == "goal: every correct export accepted and every broken one refused: met", done.stdout[-2000:]
    rows = json.loads(body[: body.rindex("}") + 1])["rows"]
    # 4 prompts at steps 0 and 30 of train, then the fine-tune correct, with a head row off by one, layers swapped
    assert [(r["stage"], r["step"], r["broken"]) for r in rows[::4]] == [
        ("train", 0, None),
        ("train", 30, None),
        ("finetune", 5, None),
        ("finetune", 5, "row"),
        ("finetune", 5, "swap"),
    ]
    assert all(r["refused"] is None for r in rows if r["broken"] is None)
    assert all(r["refused"] and r["prompt"] in r["refused"] for r in rows if r["broken"])
