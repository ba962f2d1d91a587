"""What parsing each DAG file costs the dag-processor, which pays it on every parse of the file: CPU seconds of one
`DagBag(path)` per file, in a new interpreter that has imported `airflow.sdk` and Airflow's DagBag (as the
dag-processor has) and nothing of Interlude, every DAG file parsed in turn, so a heavy module (a cloud client,
numpy, the Kubernetes client) counts against the file whose parse first imported it. `--repeat N` new interpreters
(each file's first parse is the one a fresh dag-processor pays); the median and the largest per file.

CPU (the kernel's count for the interpreter: `time.process_time`), not wall time: a busy machine stretches wall
time, not CPU. Goal: under 0.3 CPU-s per file (75488ac: dags/serving.py 0.67 -> 0.15 s once the Kubernetes client
left its parse); Airflow's own limit is `dagbag_import_timeout`, 30 s of wall time. The facts of a parse (no import
error, no heavy module, each DAG's doc and tags) are tests/dags/test_dag_integrity.py's.

    .venv/bin/python benchmarks/dag_parse.py                  # every file in dags/, 5 interpreters
    .venv/bin/python benchmarks/dag_parse.py --repeat 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL_CPU_S = 0.3
HEAVY = [
    "google.cloud.tpu_v2",
    "google.cloud.compute_v1",
    "google.cloud.storage",
    "googleapiclient.discovery",
    "kubernetes",
    "numpy",
    "jax",
]

PROBE = r"""
import json, sys, time
import airflow.sdk  # every DAG file's first import, and the dag-processor's own: not a file's cost
from airflow.dag_processing.dagbag import DagBag
heavy = json.loads(sys.argv[1])
out = {}
for path in sys.argv[2:]:
    before = set(sys.modules)
    t = time.process_time()
    bag = DagBag(path)
    out[path] = {
        "cpu_s": time.process_time() - t,
        "dags": len(bag.dags),
        "errors": len(bag.import_errors),
        "heavy": [m for m in heavy if m in sys.modules and m not in before],
    }
print("PARSED " + json.dumps(out))
"""


def parse_once(files: list[Path], home: Path) -> dict[str, dict[str, Any]]:
    """One new interpreter parsing every file in turn: per file, its CPU-s, DAGs, import errors, heavy modules."""
    env = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), *map(str, files)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    line = next(x for x in done.stdout.splitlines() if x.startswith("PARSED "))
    return dict(json.loads(line.removeprefix("PARSED ")))


def figures(runs: list[dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per file, over the runs: median and largest CPU-s, and what its parses gave (pure)."""
    rows = []
    for path in runs[0]:
        cpu = [run[path]["cpu_s"] for run in runs]
        rows.append(
            {
                "file": str(Path(path).relative_to(ROOT)),
                "parses": len(cpu),
                "cpu_s_median": round(statistics.median(cpu), 4),
                "cpu_s_max": round(max(cpu), 4),
                "dags": runs[0][path]["dags"],
                "errors": max(run[path]["errors"] for run in runs),
                "heavy": sorted({m for run in runs for m in run[path]["heavy"]}),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'file':<32} {'parses':>6} {'CPU-s median':>12} {'max':>7}  dags  heavy modules first imported"
    lines = [head, "-" * len(head)]
    for r in rows:
        heavy = ", ".join(r["heavy"]) or "-"
        cpu = f"{r['cpu_s_median']:>12.3f} {r['cpu_s_max']:>7.3f}"
        lines.append(f"{r['file']:<32} {r['parses']:>6} {cpu}  {r['dags']:>4}  {heavy}")
    worst = max(rows, key=lambda r: r["cpu_s_median"])
    met = "met" if worst["cpu_s_median"] < GOAL_CPU_S else "NOT met"
    lines.append(
        f"goal: under {GOAL_CPU_S} CPU-s per file: {met} (largest median {worst['cpu_s_median']:.3f} s, "
        f"{worst['file']}); load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="new interpreters, each parsing every file")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too (a RESULT line)")
    parser.add_argument("files", nargs="*", type=Path, help="DAG files (default: every dags/*.py)")
    args = parser.parse_args(argv)
    files = [f.resolve() for f in args.files] or sorted((ROOT / "dags").glob("*.py"))
    with tempfile.TemporaryDirectory(prefix="interlude-dag-parse-") as tmp:
        runs = [parse_once(files, Path(tmp)) for _ in range(args.repeat)]
    rows = figures(runs)
    print(table(rows))
    if args.json:
        print("RESULT " + json.dumps({"goal_cpu_s": GOAL_CPU_S, "files": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
