"""A pytest plugin for benchmarks/suite_cpu.py --by-test: the CPU each test spent, one JSON line per test.

A test's CPU is what its process spent during it (getrusage RUSAGE_SELF), plus what the processes it started
and reaped spent (RUSAGE_CHILDREN), plus its warm `airflow` children (interlude_dev.warm_cli reports theirs, since
its server reaps them). A process is counted when it is reaped: a session or module fixture's processes (the
stack, a module's local cloud) land on the test after which the fixture is torn down. With pytest-xdist each
worker writes its own file.

Loaded by suite_cpu.py (`-p suite_cpu_by_test`, with benchmarks/ on PYTHONPATH); writes into $SUITE_CPU_BY_TEST_DIR.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DIR_ENV = "SUITE_CPU_BY_TEST_DIR"


def _cpu() -> tuple[float, float, float]:
    from interlude_dev.warm_cli import WarmProcess

    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime, WarmProcess.finished_cpu_seconds


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    started, before = time.time(), _cpu()
    try:
        return (yield)
    finally:
        after = _cpu()
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        row = {
            "test": item.nodeid,
            "worker": worker,
            "started": started,
            "seconds": time.time() - started,
            "own": after[0] - before[0],
            "reaped": after[1] - before[1],
            "warm": after[2] - before[2],
        }
        with open(Path(os.environ[DIR_ENV]) / f"{worker}.jsonl", "a") as out:
            out.write(json.dumps(row) + "\n")
