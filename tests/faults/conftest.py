"""Fault suite: one local cloud for the session, and after every test two promises checked on it.

1. Nothing is left: no TPU node, VM (the cloud's own admin view) or queued resource (TPU API list) in
   any zone of the scenario. A test that leaves one fails here, whatever it asserted itself.
2. Nothing committed was lost: every checkpoint that was committed before the test (across every
   bucket and run) still verifies in full (manifest hash against COMMITTED, payload sha256).

The cloud is shared by the whole session on purpose: checkpoints of earlier tests are the ones later
tests must not damage.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from interlude import dev
from tests.faults.support import BUCKET, clear_cloud, committed_checkpoints, left_in_cloud, verify_failures


@pytest.fixture(scope="session")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCloud]:
    """The default scenario with time 3x faster than the shipped one (a TPU create takes ~0.07 s)."""
    tmp = tmp_path_factory.mktemp("faults-cloud")
    data = yaml.safe_load((dev.SCENARIOS / "default.yaml").read_text())
    data["time_scale"] = 1800
    path = tmp / "faults.yaml"
    path.write_text(yaml.safe_dump(data))
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
def nothing_left_nothing_lost(cloud: dev.LocalCloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # The session's cloud set STORAGE_EMULATOR_HOST when it started; a test of another directory run by this
    # worker since then may have pointed it elsewhere: every fault test reads and writes this cloud's GCS.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", cloud.gcs_endpoint)
    before = committed_checkpoints(cloud)
    yield
    deadline = time.monotonic() + 60  # deletes in flight finish in simulated seconds; be generous
    left = left_in_cloud(cloud)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = left_in_cloud(cloud)
    lost = verify_failures(cloud, before)
    if left:
        clear_cloud(cloud)
    assert not left, f"left in the cloud after the test: {left}"
    assert not lost, f"committed checkpoints that no longer verify: {lost}"


@pytest.fixture
def airflow_env(tmp_path: Path, airflow_db: Path, cloud: dev.LocalCloud) -> dict[str, str]:
    """An Airflow home of this test (a copy of the migrated DB) aimed at the session's local cloud."""
    home = tmp_path / "airflow"
    home.mkdir()
    (home / "airflow.db").write_bytes(airflow_db.read_bytes())
    return dev.airflow_env(home, cloud)
