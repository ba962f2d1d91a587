"""Fault suite: one local cloud for the session, and after every test two promises checked on every cloud
the test used (the session's, a module's own, and the one `stage_stack` starts for a test):

1. Nothing is left: no TPU node, VM (the cloud's own admin view) or queued resource (TPU API list) in
   any zone of the scenario. A test that leaves one fails, whatever it asserted itself.
2. Nothing committed was lost: every checkpoint that was committed in that cloud before the test (across
   every bucket and run) still verifies in full (Orbax's commit marker and step metadata, every array restored).

The check runs right after the test body (`pytest_runtest_call` below), while every fixture's cloud still
runs: a check in a fixture's teardown would come after `stage_stack` stopped its cloud, and a failure there
is an error at teardown, not a failed test.

The session's cloud is shared on purpose: checkpoints of earlier tests are the ones later tests must not
damage. A `stage_stack` cloud is fresh, so it starts with a committed checkpoint of an earlier run.

The stage tests' fixtures are here too (`stage_scenario`, `stage_stack`, `kube`; their helpers are in
stage_fixtures.py): pytest finds them, so no test imports a fixture. A module's own `stage_scenario` (a GKE
cluster, another notice) replaces the default one for its tests.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from interlude_dev import scenario
from interlude_dev import wiring as dev
from tests.faults.stage_fixtures import Stack
from tests.faults.support import BUCKET, WATCHED, left_or_lost, seed_earlier_run, watch_cloud


@pytest.fixture(scope="session")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCloud]:
    """The default scenario with time 3x faster than the shipped one (a TPU create takes ~0.07 s)."""
    tmp = tmp_path_factory.mktemp("faults-cloud")
    path = scenario.build(tmp / "faults.yaml", "default", {"time_scale": 1800})
    lc = dev.start_localcloud(path, tmp / "state")
    try:
        dev.ensure_bucket(lc, BUCKET)
        os.environ["STORAGE_EMULATOR_HOST"] = lc.gcs_endpoint
        yield lc
    finally:
        lc.stop()


@pytest.fixture(scope="session")
def airflow_db(airflow_db_template: Path) -> Path:
    """The session's migrated DB (tests/conftest.py); each DAG run copies it."""
    return airflow_db_template


@pytest.fixture(autouse=True)
def nothing_left_nothing_lost(
    cloud: dev.LocalCloud, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # The session's cloud set STORAGE_EMULATOR_HOST when it started; a test of another directory run by this
    # worker since then may have pointed it elsewhere: every fault test reads and writes this cloud's GCS.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", cloud.gcs_endpoint)
    watch_cloud(request.node, cloud)  # `stage_stack` adds its own cloud the same way


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """After the body, before any fixture is torn down: every watched cloud is empty and lost nothing."""
    failure: BaseException | None = None
    result: object = None
    try:
        result = yield
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the clouds were checked and cleared
        failure = exc
    problems = [p for cloud, before in item.stash.get(WATCHED, []) for p in left_or_lost(cloud, before)]
    if failure is not None:
        if problems:
            failure.add_note("and after the test: " + "; ".join(problems))
        raise failure
    assert not problems, "; ".join(problems)
    return result


@pytest.fixture
def airflow_env(tmp_path: Path, airflow_db: Path, cloud: dev.LocalCloud) -> dict[str, str]:
    """An Airflow home of this test (a copy of the migrated DB) aimed at the session's local cloud."""
    home = tmp_path / "airflow"
    home.mkdir()
    (home / "airflow.db").write_bytes(airflow_db.read_bytes())
    return dev.airflow_env(home, cloud)


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    """The default scenario 3x faster: a TPU's 2 h notice is 4 s, its maintenance 2 s (long enough for a poll
    to see it down); a GPU VM's 1 h notice is 2 s and its maintenance 0.17 s (no poll sees it down)."""
    return scenario.build(tmp_path / "fast.yaml", "default", scenario.FAST)


@pytest.fixture
def stage_stack(
    tmp_path: Path, airflow_db: Path, stage_scenario: Path, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """A local cloud and an Airflow home of this test. The nothing-left-nothing-lost check above reads this cloud
    after the test body, before it is stopped here; the cloud starts with a committed checkpoint of an earlier run
    for that check to protect."""
    cloud = dev.start_localcloud(stage_scenario, tmp_path / "localcloud")
    try:
        home = tmp_path / "airflow"
        home.mkdir()
        (home / "airflow.db").write_bytes(airflow_db.read_bytes())
        dev.ensure_bucket(cloud, BUCKET)
        seed_earlier_run(cloud, BUCKET)
        watch_cloud(request.node, cloud)
        yield cloud, dev.airflow_env(home, cloud)
    finally:
        cloud.stop()


@pytest.fixture
def kube(stage_stack: Stack, stage_scenario: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, Any]]:
    """The test's own clients of its scenario's GKE cluster: the Container API (GKEHook) and the Kubernetes API."""
    from interlude.hooks.gke import GKEHook

    cluster = yaml.safe_load(stage_scenario.read_text())["gke"]["clusters"][0]
    _, env = stage_stack
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    hook = GKEHook(gcp_conn_id="google_cloud_default", location=cluster["location"])
    with hook.kubernetes_hook(cluster["name"]).get_conn() as api:
        yield hook, api
