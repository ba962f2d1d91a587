"""What one `airflow dags test` costs cold (a new `airflow` process) and warm (forked from interlude_dev.warm_cli's
server, as the test suite runs them), side by side in one run (issue 16, item 4).

Starts the local cloud (default scenario) and migrates one SQLite Airflow home; each run gets a copy of it, as
the suite's tests do. Every run is the lifecycle DAG with `plan_only` (choose, validate, plan; nothing is
provisioned): the fixed cost every `dags test` of the suite pays before its DAG does anything of note. A run
counts only if it exits 0 and its log has the plan's line.

CPU is the kernel's count (user + system) for the command's process: for a cold run read with getrusage of the
reaped child, for a warm one reported by the server from wait4. The warm server's own start (its imports and
the Execution API's routes, once per pytest worker) is a row of its own.

    .venv/bin/python benchmarks/dags_test_cost.py            # ~1.5 min: 3 cold and 3 warm runs
    .venv/bin/python benchmarks/dags_test_cost.py --json     # the figures as JSON too (a RESULT line)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from interlude_dev import warm_cli  # noqa: E402
from interlude_dev import wiring as dev  # noqa: E402

DAG_ID = "interlude_training"
BUCKET = "interlude-bench-dags-test"
CONF = {"bucket": BUCKET, "data_date": "2024-01-15", "plan_only": True}
PLAN_LINE = "Plan only: would provision"


@dataclass
class Row:
    name: str
    runs: int
    cpu_s: list[float]
    wall_s: list[float]

    def cells(self) -> list[str]:
        def spread(values: list[float]) -> str:
            return f"{statistics.mean(values):6.2f} ({min(values):.2f}-{max(values):.2f})"

        return [self.name, str(self.runs), spread(self.cpu_s), spread(self.wall_s)]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_run(mode: str, template: Path, cloud: dev.LocalCloud, work: Path, index: int) -> tuple[float, float]:
    """One plan-only `dags test` in a fresh copy of the migrated home: (CPU-s, wall-s)."""
    home = work / f"{mode}-{index}"
    home.mkdir()
    shutil.copy(template, home / "airflow.db")
    env = dev.airflow_env(home, cloud)
    log = work / f"{mode}-{index}.log"
    argv = ["dags", "test", DAG_ID, "--conf", json.dumps(CONF)]
    os.environ[warm_cli.SWITCH_ENV] = "1" if mode == "warm" else "0"
    before, started = _children_cpu(), time.monotonic()
    proc = warm_cli.start_airflow(argv, env, log)
    code = proc.wait(600)
    wall = time.monotonic() - started
    text = log.read_text(errors="replace")
    if code != 0 or PLAN_LINE not in text:
        raise SystemExit(f"{mode} run {index} failed (exit {code}); log: {log}\n{text[-2000:]}")
    if isinstance(proc, warm_cli.WarmProcess):
        assert proc.cpu_seconds is not None
        return proc.cpu_seconds, wall
    return _children_cpu() - before, wall


def measure(runs: int, work: Path) -> list[Row]:
    template_home = work / "template"
    template_home.mkdir()
    dev.ensure_airflow_db(
        {**dev.bytecode_cached(os.environ), "AIRFLOW_HOME": str(template_home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    )
    cloud = dev.start_localcloud("default", work / "cloud")
    try:
        dev.ensure_bucket(cloud, BUCKET)
        env = dev.airflow_env(template_home, cloud)
        started = time.monotonic()
        server = warm_cli.server(env)
        rows = [
            Row("warm server start (once per worker)", 1, [_process_cpu(server.proc.pid)], [time.monotonic() - started])
        ]
        for mode in ("cold", "warm"):
            figures = [one_run(mode, template_home / "airflow.db", cloud, work, i) for i in range(runs)]
            rows.append(Row(f"dags test, {mode}", runs, [f[0] for f in figures], [f[1] for f in figures]))
        return rows
    finally:
        warm_cli.stop_server()
        cloud.stop()


def table(rows: list[Row]) -> str:
    head = ["", "runs", "CPU-s per run: mean (min-max)", "wall-s per run: mean (min-max)"]
    lines = [head, *[row.cells() for row in rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of each kind (default 3)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON (a RESULT line) too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="interlude-bench-dags-test-") as tmp:
        rows = measure(args.runs, Path(tmp))
    print(table(rows))
    cold, warm = rows[1], rows[2]
    saved = statistics.mean(cold.cpu_s) - statistics.mean(warm.cpu_s)
    print(
        f"saved per run: {saved:.2f} CPU-s; the server's start pays for itself after "
        f"{rows[0].cpu_s[0] / saved:.1f} runs"
        if saved > 0
        else "no CPU saved per run"
    )
    if args.json:
        print("RESULT " + json.dumps([asdict(row) for row in rows]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
