"""Shared pieces for end-to-end tests: a migrated Airflow DB per session, a local cloud per test, a runner that
does `airflow dags test` with --conf and reads back what happened from the Airflow DB, and the stack tests' one
production-shaped stack (`stack`; its pieces in stack_fixtures.py).

Why the DB and not the exit code alone: the exit code says "something failed"; which branch of the
`choose` group was taken, and that provisioning never started, are task instance states.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from interlude_dev import wiring as dev
from tests.e2e.stack_fixtures import STACK_SESSION, Stack, StackSession, stop_stack_unless_next_needs_it

DAG_ID = "interlude_training"
# The shipped fine-tuning sample covers 2024-01-01..2024-03-31; a run "today" must name a day in it.
DATA_DATE = "2024-01-15"
BUCKET = "interlude-e2e"


@pytest.fixture(scope="session")
def stack_session(request: pytest.FixtureRequest) -> Iterator[StackSession]:
    """The holder of the session's stack; whatever still runs at the end of the session is stopped."""
    holder = StackSession()
    request.config.stash[STACK_SESSION] = holder
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture(name="stack")
def stack_fixture(stack_session: StackSession) -> Stack:
    """The running stack (started by the first test that asks; shared by the tests that follow)."""
    return stack_session.up()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the test's own fixtures are torn down, stop the stack if no test right after needs it."""
    try:
        return (yield)
    finally:
        stop_stack_unless_next_needs_it(item, nextitem)


@dataclass
class DagRunResult:
    """One finished `airflow dags test` run, as the Airflow DB and the local cloud saw it."""

    exit_code: int
    run_id: str
    state: str
    states: dict[str, str | None]
    log: str
    cloud: dev.LocalCloud
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    CHOOSE_LEAVES = ("tpu", "gpu", "smaller_gpu", "convert_for_gpu", "convert_for_tpu", "wait_for_capacity", "stuck")

    def taken(self) -> set[str]:
        """The leaves of the `choose` group that ran (success or failed), i.e. the branch the run took."""
        return {
            f"choose.{leaf}"
            for leaf in self.CHOOSE_LEAVES
            if self.states.get(f"choose.{leaf}") in ("success", "failed")
        }

    def machines(self) -> list[dict[str, Any]]:
        return self.cloud.admin.machines()

    def events(self) -> list[dict[str, Any]]:
        return self.cloud.admin.events()


class RunDag(Protocol):
    def __call__(
        self, scenario: str | Path, conf: dict[str, Any], timeout: float = ..., ensure_bucket: bool = ...
    ) -> DagRunResult: ...


@pytest.fixture(scope="session")
def migrated_airflow_db(airflow_db_template: Path) -> Path:
    """The session's migrated DB (tests/conftest.py); each test copies it."""
    return airflow_db_template


def task_states(db: Path, dag_id: str, run_id: str) -> dict[str, str | None]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT task_id, state FROM task_instance WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)
        ).fetchall()
    return {task_id: state for task_id, state in rows}


def run_state(db: Path, dag_id: str, run_id: str) -> str:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (dag_id, run_id)).fetchone()
    assert row is not None, f"no dag_run {run_id}"
    return str(row[0])


@pytest.fixture
def run_dag(tmp_path: Path, migrated_airflow_db: Path) -> Iterator[RunDag]:
    """Start the named local cloud scenario, run the lifecycle DAG on it once, return what happened.

    The cloud stays up until the test ends, so the test can ask it what exists; then it is stopped
    (with the machines it ran) so no process outlives the test.
    """
    clouds: list[dev.LocalCloud] = []

    def run(
        scenario: str | Path, conf: dict[str, Any], timeout: float = 300, ensure_bucket: bool = True
    ) -> DagRunResult:
        cloud = dev.start_localcloud(scenario, tmp_path / f"cloud-{len(clouds)}")
        clouds.append(cloud)
        home = tmp_path / f"airflow-{len(clouds)}"
        home.mkdir()
        shutil.copy(migrated_airflow_db, home / "airflow.db")
        env = dev.airflow_env(home, cloud)
        full = {"bucket": BUCKET, "data_date": DATA_DATE, **conf}
        if ensure_bucket:
            dev.ensure_bucket(cloud, full["bucket"])
        log_path = tmp_path / f"dags-test-{len(clouds)}.log"
        started = time.monotonic()
        try:
            result = dev.dags_test(env, DAG_ID, full, log_path, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"airflow dags test did not finish in {timeout} s; log: {log_path}")
        seconds = time.monotonic() - started
        assert result.run_id, f"no 'DagRun Finished' line in {log_path}"
        db = home / "airflow.db"
        state = run_state(db, DAG_ID, result.run_id)
        assert state == result.state, f"DB says {state}, the closing log line says {result.state}"
        return DagRunResult(
            exit_code=result.returncode,
            run_id=result.run_id,
            state=state,
            states=task_states(db, DAG_ID, result.run_id),
            log=result.log,
            cloud=cloud,
            seconds=seconds,
        )

    try:
        yield run
    finally:
        for cloud in clouds:
            cloud.stop()
