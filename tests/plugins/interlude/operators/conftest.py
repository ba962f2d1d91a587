"""The training operators' local cloud: one per module, with its own GCS, and this process pointed at both.

The Google connection comes from the environment (`RunningLocalCloud.airflow_conn_env`, what Airflow's
processes get from `interlude_dev.wiring.airflow_env`) and GCS from STORAGE_EMULATOR_HOST, so the operators
run exactly as in a task: through their hooks, with nothing patched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from interlude_localcloud.testing import RunningLocalCloud, running_localcloud


@pytest.fixture(scope="module")
def training_cloud() -> Iterator[RunningLocalCloud]:
    """The default scenario (plenty of TPUs and GPUs; time 600x Google's), strict: every answer checked
    against Google's discovery documents."""
    with running_localcloud("default", strict=True, gcs=True) as lc, pytest.MonkeyPatch.context() as mp:
        for name, value in lc.airflow_conn_env().items():
            mp.setenv(name, value)
        mp.setenv("STORAGE_EMULATOR_HOST", lc.gcs_endpoint)
        yield lc
        assert lc.violations == []


@pytest.fixture(scope="module")
def training_bucket(training_cloud: RunningLocalCloud) -> str:
    from interlude_workload.gcs import storage_client

    name = f"ops-{uuid.uuid4().hex[:10]}"
    storage_client().create_bucket(name)
    return name


@pytest.fixture
def teardown_runs(training_cloud: RunningLocalCloud) -> Iterator[list[Any]]:
    """RunSpecs appended here are torn down after the test by the DAG's own teardown task (every machine and
    queued resource of the run, by label and intent record), so one test's machines never meet the next."""
    from interlude.training import tasks

    specs: list[Any] = []
    yield specs
    for spec in specs:
        tasks.teardown(spec)
