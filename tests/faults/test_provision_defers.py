"""Issue 12 item 3: waiting for a queued resource happens in the triggerer, not on a worker slot.

Real pieces: a local cloud whose only v6e-8 in the zone is taken by another node, `airflow dags test`
of the lifecycle DAG (a TPU-only profile that asks through a queued resource), and Airflow's own
database read while the run waits: the provision task deferred to the queued-resource trigger (its state
changes as the database recorded them, the trigger row), no task is RUNNING and nothing holds the
accelerator pool. Then the other node goes away, the queued resource gets the capacity and the run finishes.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlude_dev import scenario, warm_cli
from interlude_dev import wiring as dev
from tests.faults.support import (
    BASE,
    BUCKET,
    DAG_ID,
    Waiting,
    dags_test,
    record_task_states,
    tpu_hook,
    waiting_in_trigger,
)

pytestmark = pytest.mark.e2e
ZONE = "us-central1-a"
POOL = "interlude_accelerators"
QR_TRIGGER = "interlude.triggers.provision.QueuedResourceTrigger"


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dev.LocalCloud]:
    """One v6e-8 in the zone, nothing else a TPU-only model could use."""
    tmp = tmp_path_factory.mktemp("defer-cloud")
    one_v6e = {"accelerator_types": ["v6e-8"], "capacity": {"v6e-8": {"on_demand": 1, "spot": 0}}}
    path = scenario.build(
        tmp / "one-v6e.yaml",
        "default",
        {"time_scale": 1800},
        {
            "zones": {ZONE: {"tpu": one_v6e}, "us-central2-b": scenario.DELETE},
            "regions": {"us-central2": scenario.DELETE},
        },
    )
    lc = dev.start_localcloud(path, tmp / "state")
    try:
        dev.ensure_bucket(lc, BUCKET)
        yield lc
    finally:
        lc.stop()


def _read(db: Path, sql: str, *args: str) -> list[tuple]:
    for _ in range(20):
        try:
            with sqlite3.connect(db, timeout=5) as conn:
                return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError:  # Airflow holds the write lock for a moment
            time.sleep(0.2)
    return []


def test_waiting_queued_resource_defers_provision_and_frees_the_pool(cloud, airflow_env, tmp_path: Path) -> None:
    tpu = tpu_hook(cloud)
    tpu.create_node(ZONE, "someone-else", {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e"})
    conf = {**BASE, "zones": [ZONE], "model_profile": "maxtext-tpu-only", "poll_seconds": 0.5}
    home = Path(airflow_env["AIRFLOW_HOME"])
    db = home / "airflow.db"
    record_task_states(home)
    log_path = tmp_path / "dags-test.log"
    proc = warm_cli.start_airflow(["dags", "test", DAG_ID, "--conf", json.dumps(conf)], airflow_env, log_path)
    try:
        deadline = time.monotonic() + 300
        seen: dict[str, object] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            # Airflow's own state, not its log: provision deferred (the database recorded it) and is waiting in
            # its trigger while the cloud says the queued resource waits for resources.
            deferred = waiting_in_trigger(home, "provision")
            waiting = [
                e
                for e in cloud.admin.events()
                if e["event"] == "queued_resource_state" and e.get("state") == "WAITING_FOR_RESOURCES"
            ]
            if deferred and waiting and proc.poll() is None:
                pool = _read(db, "SELECT pool FROM task_instance WHERE task_id = 'provision'")
                held = _read(
                    db,
                    "SELECT task_id, state FROM task_instance WHERE pool = ? AND state IN "
                    "('running', 'queued', 'deferred', 'scheduled')",
                    POOL,
                )
                seen = {"pool": pool[0][0] if pool else None, "held": held, "deferred": deferred}
                break
            time.sleep(0.5)
        assert seen, f"provision was never seen waiting in its trigger; log tail:\n{log_path.read_text()[-3000:]}"
        found = seen["deferred"]
        assert isinstance(found, Waiting) and found.classpath == QR_TRIGGER, seen
        assert found.running == [], f"a task holds a worker slot while provision waits: {seen}"
        assert seen["held"] == [], f"accelerator pool slots held while provision waits: {seen}"
        assert seen["pool"] == "default_pool", seen  # deferred tasks hold no slot there
        tpu.delete_node(ZONE, "someone-else")  # the capacity frees: the queued resource gets it
        proc.wait(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        tpu.delete_node(ZONE, "someone-else")
    text = log_path.read_text()
    assert "state=success" in text.rsplit("DagRun Finished", 1)[-1], text[-4000:]


def test_a_queued_resource_google_fails_at_its_deadline_fails_the_run_and_is_deleted(
    cloud, airflow_env, tmp_path: Path
) -> None:
    """`queue_wait_seconds` travels as the queued resource's validUntilDuration: Google (here the local cloud,
    600 Google seconds = 0.3 s at its time scale) moves the waiting request to FAILED, the provision task fails
    naming it, the run fails, and nothing of it (node or queued resource) is left in the cloud."""
    tpu = tpu_hook(cloud)
    tpu.create_node(ZONE, "someone-else", {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e"})
    try:
        since = time.time()
        conf = {**BASE, "zones": [ZONE], "model_profile": "maxtext-tpu-only", "queue_wait_seconds": 600}
        run = dags_test(airflow_env, DAG_ID, conf, tmp_path / "dags-test.log")
    finally:
        tpu.delete_node(ZONE, "someone-else")
    assert run.state == "failed", (run.state, run.states)
    assert run.states["provision"] == "failed", run.states
    assert run.states["teardown"] == "success", run.states
    states = [
        (e.get("queued_resource", ""), e.get("state"))
        for e in cloud.admin.events(since)
        if e["event"] == "queued_resource_state"
    ]
    assert any(state == "FAILED" for _, state in states), states  # the cloud's own account of the request
    assert "queued resource is FAILED" in run.log, run.log[-3000:]
    assert any(e["event"] == "queued_resource_deleted" for e in cloud.admin.events(since))
