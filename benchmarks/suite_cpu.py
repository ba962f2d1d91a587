"""Where the test suite's CPU goes, by kind of process: `airflow dags test`, the stack's components, the local
cloud, the workload's agents and trainers, the pytest workers themselves.

Why: on the 2-core machine the suite is bound by CPU, not by waiting (issue 16: ~30-37 CPU-minutes, so no
order of the tests brings `make test` much under 15-18 minutes). Cutting it means knowing which processes
spend it; pytest's durations say which test is long, not which process in it is busy.

How: pytest runs as a child; every `--interval` seconds the CPU (utime + stime from /proc/PID/stat) of each
of its descendants is read, and the last reading of each process counts. A process that lives less than one
interval may be missed (its CPU then goes to nobody: the total is a lower bound).

Run: `.venv/bin/python benchmarks/suite_cpu.py -- -n 6 --dist loadgroup` (the whole suite as `make test`
runs it, ~15 min), or any pytest arguments after `--` for a subset. `--json` prints the table as JSON.
`--by-test N` also prints the N tests and files that cost most (benchmarks/suite_cpu_by_test.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")

# (kind, pattern over the command line): the first match names the process. Order matters: the stack's
# components before "airflow (other)", the workload's agent before its other modules.
KINDS: tuple[tuple[str, str], ...] = (
    ("airflow dags test: warm server (imports once per worker)", r"interlude_dev\.warm_server"),
    ("airflow dags test", r"airflow dags test"),
    ("airflow db migrate", r"airflow db migrate"),
    ("stack: api-server", r"api.server"),
    ("stack: scheduler", r"airflow scheduler"),
    ("stack: dag-processor", r"dag.processor"),
    ("stack: triggerer", r"triggerer"),
    ("stack: celery worker", r"celery"),
    ("airflow (other: CLI calls, task supervisors)", r"airflow"),
    ("local cloud: fork server (imports the workload once)", r"^\[il-zygote\]"),
    ("local cloud: machine roots (fork server)", r"^\[il-root\]"),
    ("workload: agent", r"^\[il-agent\]"),
    ("workload: trainer", r"^\[il-train\]"),
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
            comm, rest = f.read().split("(", 1)[1].rsplit(")", 1)
            fields = rest.split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        # a fork of the local cloud's fork server keeps the zygote's command line; its name says what it runs. A
        # zombie's command line is empty: left empty, so that sample() keeps what it read while the process lived
        cmdline = f"[{comm}] {cmdline}" if cmdline else ""
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


def run(pytest_args: list[str], interval: float, env: dict[str, str] | None = None) -> tuple[list[Row], float, int]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args], cwd=ROOT, env=env)
    seen: dict[int, tuple[str, float]] = {}
    while proc.poll() is None:
        sample(proc.pid, seen)
        time.sleep(interval)
    return table(seen), time.monotonic() - started, proc.returncode


@dataclass
class CpuOfTest:
    """One test's CPU (benchmarks/suite_cpu_by_test.py): its process's own, the processes it reaped, its warm
    `airflow` children's."""

    test: str
    worker: str
    started: float  # wall clock (time.time()) at the test's start: a worker's rows in order are its timeline
    seconds: float
    own: float
    reaped: float
    warm: float

    @property
    def cpu(self) -> float:
        return self.own + self.reaped + self.warm


def read_by_test(directory: Path) -> list[CpuOfTest]:
    """Every test's row, most CPU first."""
    rows = [
        CpuOfTest(**json.loads(line))
        for path in sorted(directory.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return sorted(rows, key=lambda r: -r.cpu)


def by_file(tests: list[CpuOfTest]) -> list[tuple[str, float]]:
    cpu: dict[str, float] = defaultdict(float)
    for t in tests:
        cpu[t.test.split("::", 1)[0]] += t.cpu
    return sorted(cpu.items(), key=lambda item: -item[1])


def print_by_test(tests: list[CpuOfTest], top: int) -> None:
    print(f"\nCPU by test ({sum(t.cpu for t in tests) / 60:.1f} CPU-min in {len(tests)} tests; a fixture's processes")
    print("count for the test after which it is torn down: a stack's for the last test of its shard)")
    print(f"{'CPU-s':>7} {'own':>6} {'reaped':>7} {'warm':>6} {'wall-s':>7}  test")
    for t in tests[:top]:
        print(f"{t.cpu:>7.1f} {t.own:>6.1f} {t.reaped:>7.1f} {t.warm:>6.1f} {t.seconds:>7.0f}  {t.test}")
    print(f"\n{'CPU-s':>7}  file")
    for path, cpu in by_file(tests)[:top]:
        print(f"{cpu:>7.1f}  {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between readings")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--by-test", type=int, default=0, metavar="N", help="also the N tests and files costing most")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: the arguments pytest gets")
    args = parser.parse_args(argv)
    pytest_args = [a for a in args.pytest_args if a != "--"] or ["-q"]
    with tempfile.TemporaryDirectory(prefix="suite-cpu-by-test-") as tmp:
        env = None
        if args.by_test:
            path = os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
            env = {**os.environ, "PYTHONPATH": path, "SUITE_CPU_BY_TEST_DIR": tmp}
            pytest_args = ["-p", "suite_cpu_by_test", *pytest_args]
        rows, wall, rc = run(pytest_args, args.interval, env)
        tests = read_by_test(Path(tmp)) if args.by_test else []
    total = sum(r.cpu_seconds for r in rows)
    if args.json:
        result = {"wall_seconds": wall, "returncode": rc, "rows": [r.__dict__ for r in rows]}
        print(json.dumps({**result, "tests": [{**t.__dict__, "cpu": t.cpu} for t in tests[: args.by_test]]}))
        return rc
    print(f"\npytest {' '.join(pytest_args)}: exit {rc}, {wall / 60:.1f} min wall, {total / 60:.1f} CPU-min seen")
    print(f"{'kind':<52} {'procs':>6} {'CPU-min':>8} {'share':>6} {'CPU-s/proc':>11}")
    for r in rows:
        share = r.cpu_seconds / total if total else 0.0
        per = r.cpu_seconds / r.processes
        print(f"{r.kind:<52} {r.processes:>6} {r.cpu_seconds / 60:>8.2f} {share:>6.1%} {per:>11.1f}")
    if tests:
        print_by_test(tests, args.by_test)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
