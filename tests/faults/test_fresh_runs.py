"""Issue 10 items 4 and 5: `fresh` really starts over, and nothing committed is deleted on an unknown.

Real pieces: `airflow dags test` twice with the same run id on the local cloud (the machine's agent
and trainer run as its machine processes), the reference trainer as a subprocess behind a real HTTP
proxy that fails one read, and GCS objects' own creation times as the independent fact.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interlude import naming
from interlude_dev import wiring as dev
from tests.faults.support import BASE, BUCKET, DAG_ID, ZONES, dags_test, failing_gcs_proxy, left_in_cloud

pytestmark = pytest.mark.e2e


def _commit_times(cloud: dev.LocalCloud, run_key: str) -> dict[str, float]:
    """Every step's commit marker (Orbax's commit_success.txt at the step's root) of the run -> its GCS creation
    time (the storage's clock, not ours)."""
    client = dev.gcs_client(cloud)
    return {
        b.name: b.time_created.timestamp()
        for b in client.list_blobs(BUCKET, prefix=f"interlude/{run_key}/")
        if re.search(r"/checkpoints/\d+/commit_success\.txt$", b.name)
    }


def test_fresh_rerun_with_the_same_run_id_recomputes_every_checkpoint(cloud, airflow_env, tmp_path: Path) -> None:
    conf = {**BASE, "zones": list(ZONES), "resume_policy": "fresh"}
    date = "2024-02-01T00:00:00+00:00"  # the same logical date twice: the same run id
    first = dags_test(airflow_env, DAG_ID, conf, tmp_path / "first.log", run_at=date)
    assert first.state == "success", first.log[-4000:]
    key = naming.run_key(DAG_ID, first.run_id)
    before = _commit_times(cloud, key)
    assert len(before) == 3, before  # train 10, 20; finetune 10
    between = time.time()

    second = dags_test(airflow_env, DAG_ID, conf, tmp_path / "second.log", run_at=date)

    assert second.run_id == first.run_id
    assert second.state == "success", second.log[-4000:]
    after = _commit_times(cloud, key)
    assert set(after) == set(before)
    stale = {name: t for name, t in after.items() if t < between}
    assert not stale, f"checkpoints the fresh re-run did not recompute (first-run timestamps): {stale}"
    assert left_in_cloud(cloud) == []


def _train(env: dict[str, str], run_key: str, token: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "interlude_workload.train",
        "--bucket",
        BUCKET,
        "--run-key",
        run_key,
        "--stage",
        "train",
        "--steps",
        "20",
        "--checkpoint-every",
        "10",
        "--seed",
        "1",
        "--fresh",
        token,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


def test_failed_fresh_marker_read_wipes_nothing(cloud) -> None:
    run_key = naming.run_key(DAG_ID, f"fresh-read-{time.time_ns()}")
    env = {**os.environ, "STORAGE_EMULATOR_HOST": cloud.gcs_endpoint}
    done = _train(env, run_key, "token-1")
    assert done.returncode == 0, done.stderr[-3000:]
    before = _commit_times(cloud, run_key)
    assert len(before) == 2, before

    # The same token again (a reboot of the same fresh run), but reading fresh.json fails once.
    proxy = failing_gcs_proxy(cloud.gcs_endpoint, lambda method, path: method == "GET" and "fresh.json" in path)
    try:
        again = _train({**env, "STORAGE_EMULATOR_HOST": proxy.endpoint}, run_key, "token-1")
    finally:
        proxy.stop()
    assert again.returncode != 0, "a trainer that could not read its fresh marker must not go on"
    assert _commit_times(cloud, run_key) == before, "committed checkpoints were deleted on an unknown"


def test_a_commit_marker_does_not_skip_the_step_metadata_check(cloud) -> None:
    """Orbax's commit_success.txt is there, but the step metadata says the save never finished (no commit time, as
    Orbax leaves it mid-save): the marker alone is no evidence."""
    import numpy as np

    from interlude_workload.checkpoints import STEP_METADATA, CheckpointStore

    run_key = naming.run_key(DAG_ID, f"empty-marker-{time.time_ns()}")
    store = CheckpointStore(BUCKET, run_key, "train", client=dev.gcs_client(cloud))
    store.write(10, {"weights": np.zeros(64)}, metrics={"loss": 1.0})
    blob = store.bucket.blob(store.step_prefix(10) + STEP_METADATA)
    metadata = json.loads(blob.download_as_bytes())
    del metadata["commit_timestamp_nsecs"]
    blob.upload_from_string(json.dumps(metadata))
    try:
        result = store.latest(verify="full")
        assert result.checkpoint is None, "a commit marker let a step Orbax never finished through"
        assert [r.step for r in result.rejected] == [10]
    finally:
        store.wipe()  # a tampered "committed" step must not stay for later tests' checks
