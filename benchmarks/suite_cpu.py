"""Where the test suite's CPU goes, by kind of process: `airflow dags test`, the stack's components, the local
cloud, the workload's agents and trainers, the pytest workers themselves.

Why: on the 2-core machine the suite is bound by CPU, not by waiting (issue 16: ~30-37 CPU-minutes, so no
order of the tests brings `make test` much under 15-18 minutes). Cutting it means knowing which processes
spend it; pytest's durations say which test is long, not which process in it is busy.

How: pytest runs as a child; every `--interval` seconds the CPU (utime + stime from /proc/PID/stat) of each
of its descendants is read, and the last reading of each process counts. A process that lives less than one
interval may be missed (its CPU then goes to nobody: the total is a lower bound).

Run: `.venv/bin/python benchmarks/suite_cpu.py -- -n 4 --dist loadgroup` (the whole suite as `make test`
runs it, ~20 min), or any pytest arguments after `--` for a subset. `--json` prints the table as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")

# (kind, pattern over the command line): the first match names the process. Order matters: the stack's
# components before "airflow (other)", the workload's agent before its other modules.
KINDS: tuple[tuple[str, str], ...] = (
    ("airflow dags test: warm server (imports once per worker)", r"interlude\.warm_server"),
    ("airflow dags test", r"airflow dags test"),
    ("airflow db migrate", r"airflow db migrate"),
    ("stack: api-server", r"api.server"),
    ("stack: scheduler", r"airflow scheduler"),
    ("stack: dag-processor", r"dag.processor"),
    ("stack: triggerer", r"triggerer"),
    ("stack: celery worker", r"celery"),
    ("airflow (other: CLI calls, task supervisors)", r"airflow"),
    ("local cloud: GCS emulator", r"gcs_emulator"),
    ("local cloud", r"interlude_localcloud"),
    ("workload: agent", r"interlude_workload\.agent"),
    ("workload: trainer", r"interlude_workload"),
    ("vLLM stand-in", r"standin|vllm"),
    ("chromium", r"chrom"),
    ("postgres / redis", r"postgres|redis"),
    ("pytest (workers, collection, the tests' own code)", r"-m pytest|pytest-xdist|bin/pytest"),
    ("benchmarks run by tests", r"benchmarks/"),
)
OTHER = "other"


def kind_of(cmdline: str) -> str:
    """The kind of a process, from its command line (KINDS; OTHER when none matches)."""
    for kind, pattern in KINDS:
        if re.search(pattern, cmdline):
            return kind
    return OTHER


@dataclass
class Row:
    kind: str
    processes: int
    cpu_seconds: float


def table(cpu_by_pid: dict[int, tuple[str, float]]) -> list[Row]:
    """CPU per kind, largest first."""
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for cmdline, seconds in cpu_by_pid.values():
        kind = kind_of(cmdline)
        cpu[kind] += seconds
        count[kind] += 1
    return sorted((Row(k, count[k], cpu[k]) for k in cpu), key=lambda r: -r.cpu_seconds)


def _parents() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children[ppid].append(int(entry))
    return children


def _read(pid: int) -> tuple[str, float] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, IndexError):
        return None
    return cmdline, (int(fields[11]) + int(fields[12])) / TICKS


def sample(root: int, seen: dict[int, tuple[str, float]]) -> None:
    """One reading of every descendant of `root` (and root itself) into `seen` (pid -> cmdline, CPU s)."""
    children = _parents()
    todo = [root]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        reading = _read(pid)
        if reading is None:
            continue
        cmdline, cpu = reading
        old = seen.get(pid)
        if old is None or cpu >= old[1]:  # a pid reused by a new process starts lower: keep the larger
            seen[pid] = (cmdline or (old[0] if old else "?"), cpu)


def run(pytest_args: list[str], interval: float) -> tuple[list[Row], float, int]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT)
    seen: dict[int, tuple[str, float]] = {}
    while proc.poll() is None:
        sample(proc.pid, seen)
        time.sleep(interval)
    return table(seen), time.monotonic() - started, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between readings")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: the arguments pytest gets")
    args = parser.parse_args(argv)
    pytest_args = [a for a in args.pytest_args if a != "--"] or ["-q"]
    rows, wall, rc = run(pytest_args, args.interval)
    total = sum(r.cpu_seconds for r in rows)
    if args.json:
        print(json.dumps({"wall_seconds": wall, "returncode": rc, "rows": [r.__dict__ for r in rows]}))
        return rc
    print(f"\npytest {' '.join(pytest_args)}: exit {rc}, {wall / 60:.1f} min wall, {total / 60:.1f} CPU-min seen")
    print(f"{'kind':<52} {'procs':>6} {'CPU-min':>8} {'share':>6} {'CPU-s/proc':>11}")
    for r in rows:
        share = r.cpu_seconds / total if total else 0.0
        per = r.cpu_seconds / r.processes
        print(f"{r.kind:<52} {r.processes:>6} {r.cpu_seconds / 60:>8.2f} {share:>6.1%} {per:>11.1f}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
