"""Shared fixtures: one real GCS emulator per session, a fresh bucket per test."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from interlude_workload.testing import GcsEmulator, running_gcs_emulator

# The quick loop's selection (`--quick`, the `processes` and `model` marks: tests/quick.py), and fixtures that tests
# in more than one directory use, found here so that no test imports a fixture: the local GKE cloud (`gke_lc`,
# `gke_conn`) of the local cloud's GKE tests and the serving triggers' tests; pytester for the selection's own test.
pytest_plugins = ["tests.quick", "tests.include.interlude_localcloud.gke.cluster", "pytester"]


def pytest_configure(config: pytest.Config) -> None:
    """Cache bytecode in this session and every process it starts, whatever the environment says; run
    `airflow dags test` warm.

    With PYTHONDONTWRITEBYTECODE=1 each `airflow dags test`, stack component, local cloud and trainer
    compiles Airflow, FastAPI and the Google clients from source again: ~12 s of every `dags test`.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    # Each `airflow dags test` is a child forked from a warm Airflow (include/devtools/interlude_dev/warm_cli.py), not a
    # cold start: ~11 of its ~16 CPU-s. INTERLUDE_WARM_AIRFLOW=0 runs each as a new process instead.
    os.environ.setdefault("INTERLUDE_WARM_AIRFLOW", "1")
    # Every reference trainer the suite starts directly (and every one a local cloud's machine starts) trains the
    # tiny reference model unless told otherwise: dozens train at once on two cores (interlude_workload.train).
    os.environ.setdefault("INTERLUDE_MODEL_SIZE", "tiny")
    # `--quick` (make test-quick) runs no Airflow: no warm server for it (~8 CPU-s).
    if _is_xdist_controller(config) and not config.option.collectonly and not config.getoption("quick"):
        # One warm server for the whole run, started by the controller while its workers start and collect; the
        from interlude_dev import warm_cli

        # workers (and what they start) fork their `airflow` children from it (SOCKET_ENV) instead of warming up
        # one each (~7 CPU-s apiece).
        if warm_cli.enabled() and not os.environ.get(warm_cli.SOCKET_ENV):
            warm_cli.share_server(dict(os.environ))

    if not os.environ.get("PYTEST_XDIST_WORKER") and not config.option.collectonly and not config.getoption("quick"):
        # One fork server for the run (include/interlude_localcloud/forkserver): every local cloud the tests start,
        # in process or as a process, boots its machines as forks of one zygote that imported the workload once,
        # instead of one zygote each (~2.7 CPU-s apiece). Not waited for: until it serves, machines boot cold.
        from interlude_localcloud.forkserver.client import ForkServer, enabled

        if enabled():
            config.stash[_ZYGOTE] = ForkServer.share()


_ZYGOTE = pytest.StashKey[Any]()


def pytest_unconfigure(config: pytest.Config) -> None:
    zygote = config.stash.get(_ZYGOTE, None)
    if zygote is not None:
        zygote.close()
    if _is_xdist_controller(config):
        from interlude_dev import warm_cli

        warm_cli.stop_server()


def _is_xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not os.environ.get("PYTEST_XDIST_WORKER")


# With pytest-xdist, tests/xdist_scheduling.py decides which tests run together on one worker (the stack's
# tests in shards, one stack each; each per-test end-to-end test alone; each other file whole) and in what order.
STACK_SESSION_FIXTURE = "stack_session"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` (what `make test` asks for) gets this suite's grouping; other modes stay xdist's."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_scheduling import GroupedScheduling

    return GroupedScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the stack's tests first (in their own order): they are the longest chains, so they start at once
    while the other workers share the rest. The scheduler finds them by file: a test elsewhere that uses the
    stack would be scheduled apart from its stack, so it is refused here."""
    from tests.xdist_scheduling import STACK_FILES, is_stack_test

    strays = [
        item.nodeid
        for item in items
        if STACK_SESSION_FIXTURE in getattr(item, "fixturenames", ()) and not is_stack_test(item.nodeid)
    ]
    if strays:
        raise pytest.UsageError(f"tests using the stack outside {STACK_FILES} (tests/xdist_scheduling.py): {strays}")
    items.sort(key=lambda item: not is_stack_test(item.nodeid))  # stable: every other order is kept


@pytest.fixture(scope="session")
def airflow_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`airflow db migrate` once per run (~3-7 CPU-s warm, ~12 cold); every Airflow home of every test
    copies the result instead of migrating its own. Under pytest-xdist the workers share one template
    (pytest-xdist's recipe: a file lock in the directory all workers' temp dirs share), so four workers
    migrate once, not four times. Tests only ever copy it; so do the benchmarks and demos a test that asks for
    this fixture starts (`dev.DB_TEMPLATE_ENV`)."""
    from filelock import FileLock

    from interlude_dev import wiring as dev

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    home = shared / "airflow-template"
    with FileLock(str(shared / "airflow-template.lock")):
        if not (home / "migrated").exists():
            home.mkdir(exist_ok=True)
            (home / "airflow.db").unlink(missing_ok=True)  # a worker's failed migration left half a database
            env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
            env.pop(dev.DB_TEMPLATE_ENV, None)  # this is the migration the others copy
            dev.ensure_airflow_db(env)
            (home / "migrated").touch()
    # The benchmarks and demos that tests start (as processes or in this one) copy it too (dev.ensure_airflow_db).
    os.environ[dev.DB_TEMPLATE_ENV] = str(home / "airflow.db")
    return home / "airflow.db"


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    with running_gcs_emulator() as emulator:
        yield emulator


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket; STORAGE_EMULATOR_HOST points this process (and children) at the emulator."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    name = f"b-{uuid.uuid4().hex[:12]}"
    gcs_emulator.create_bucket(name)
    return name
