"""Shared fixtures: one real GCS emulator per session, a fresh bucket per test."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlude_workload.testing import GcsEmulator, running_gcs_emulator


def pytest_configure(config: pytest.Config) -> None:
    """Cache bytecode in this session and every process it starts, whatever the environment says.

    With PYTHONDONTWRITEBYTECODE=1 each `airflow dags test`, stack component, local cloud and trainer
    compiles Airflow, FastAPI and the Google clients from source again: ~12 s of every `dags test`.
    """
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


# With pytest-xdist (`make test` runs `-n auto --dist loadgroup`), a group runs whole on one worker, in order.
# Tests that use the production-shaped stack share one (session-scoped, so one per worker): one group. The
# end-to-end and fault tests start their own Airflow and local cloud per test, so each is its own unit and
# the long ones overlap; every other file keeps its tests (and its module-scoped fixtures) together.
STACK_GROUP = "stack"
PER_TEST_DIRS = ("tests/e2e/", "tests/faults/", "tests/benchmarks/", "tests/include/scripts/")
WHOLE_FILES = ("tests/e2e/test_serving_dag.py", "tests/faults/test_provision_defers.py")  # module-scoped clouds


def xdist_group_of(item: pytest.Item) -> str | None:
    """The group an item runs in under `--dist loadgroup` (None: any worker, on its own)."""
    path = item.nodeid.split("::", 1)[0]
    if "stack_session" in getattr(item, "fixturenames", ()):
        return STACK_GROUP
    if path.startswith(PER_TEST_DIRS) and path not in WHOLE_FILES:
        return None
    return path


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each item with its xdist group before xdist reads the marks (its hook runs after this one), and
    put the stack's tests first (in their own order): they are the longest chain on one worker, so they
    start at once while the other workers share the rest."""
    for item in items:
        group = xdist_group_of(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: xdist_group_of(item) != STACK_GROUP)  # stable: every other order is kept


@pytest.fixture(scope="session")
def airflow_db_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`airflow db migrate` once per session (~3 s warm, ~7 s cold); every Airflow home of every test
    copies the result instead of migrating its own."""
    from interlude import dev

    home = tmp_path_factory.mktemp("airflow-template")
    dev.ensure_airflow_db({**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
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
