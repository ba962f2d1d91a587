"""Issue 35: a TPU7x run is planned on GKE, never on the Cloud TPU API or Compute Engine, and a cluster whose GKE
version predates Ironwood is refused before anything is created, naming ``gke_cluster``.

``airflow dags test`` with ``plan_only`` on the local cloud, whose us-central1-a sells v6e through the TPU API and
lists ``tpu7x-standard-4t`` (Ironwood's 4-chip VM) for GKE node pools; two clusters there: one at a GKE version
that runs Ironwood (1.34.0-gke.2201000 or later on Standard, Google's Ironwood page) and one before it.

A plan-only run creates nothing, so "planned on GKE" is judged from what the cloud was asked, in its own request log,
while Airflow (its task instance's start and end in its DB, not Interlude's words) says the runtime check ran: the
check of a GKE plan asks GKE's Container API for the cluster (the control plane's version a tpu7x pool needs), where
a plan on the TPU API would ask the TPU API for runtime versions and a Compute plan would ask nothing of GKE; and
nothing at all is asked of the TPU API or Compute Engine then. Both logs are the cloud's and Airflow's records of the
calls, made by the server and the scheduler, so a plan line printed whatever was planned cannot satisfy them. Also
judged from the cloud's event log (no create of any kind, no node pool operation) and its node pools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from interlude_dev import scenario
from interlude_dev import wiring as dev

from .stage_fixtures import run_dag

pytestmark = pytest.mark.e2e

LOCATION = "us-central1"
IMAGE = "us-docker.pkg.dev/interlude-local/interlude/workload:1"
CLUSTERS = {"ironwood": "1.34.1-gke.1829001", "older": "1.33.5-gke.1080000"}
CONF: dict[str, Any] = {
    "plan_only": True,
    "platforms": ["tpu_api", "compute", "gke"],
    "gke_location": LOCATION,
    "gke_image": IMAGE,
    "tpu_types": ["tpu7x-8"],
    "zones": ["us-central1-a"],
}
CREATES = {"gce_instance_insert", "tpu_node_create", "queued_resource_create", "machine_boot"}


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    clusters = (scenario.gke_cluster(name, LOCATION, version) for name, version in CLUSTERS.items())
    changes = {
        "time_scale": 1800,
        "zones": {"us-central1-a": {"gpu": {"tpu_machine_types": ["tpu7x-standard-4t"]}}},
        "gke": scenario.gke(*clusters, run=False),
    }
    return scenario.build(tmp_path / "tpu7x.yaml", "default", changes)


def _pools(cloud: dev.LocalCloud, cluster: str) -> list[str]:
    from interlude.hooks.gke import GKEHook

    hook = GKEHook(gcp_conn_id="google_cloud_default", location=LOCATION)
    parent = f"projects/{hook.project_id}/locations/{LOCATION}/clusters/{cluster}"
    return [p.name for p in hook.get_cluster_manager_client().list_node_pools(parent=parent).node_pools]


def _task_window(env: dict[str, str], run_id: str, task_id: str) -> tuple[float, float]:
    """When Airflow ran the task (its task instance's start and end dates in its own DB), as epoch seconds."""
    import sqlite3
    from datetime import UTC, datetime

    with sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db") as db:
        row = db.execute(
            "SELECT start_date, end_date FROM task_instance WHERE run_id = ? AND task_id = ?", (run_id, task_id)
        ).fetchone()
    assert row and row[0] and row[1], (task_id, row)

    def epoch(value: str) -> float:
        at = datetime.fromisoformat(value)
        return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()

    return epoch(row[0]), epoch(row[1])


def _asked_while(cloud: dev.LocalCloud, window: tuple[float, float]) -> list[tuple[str, str]]:
    """What the cloud was asked (its request log) while the window lasted."""
    return [(r["method"], r["path"]) for r in cloud.admin.requests(window[0]) if r["t"] <= window[1]]


def _api(path: str) -> str:
    """Which Google API a request path of the local cloud belongs to (Container API v1, TPU API v2*, Compute)."""
    return "compute" if path.startswith("/compute/") else "tpu" if path.startswith("/v2") else "container"


def _nothing_created(cloud: dev.LocalCloud) -> None:
    events = cloud.admin.events()
    assert [e for e in events if e["event"] in CREATES] == []
    assert [e for e in events if e["event"].startswith("gke_operation")] == []
    assert dev.machines(cloud) == []


def test_a_tpu7x_run_is_planned_on_gke_and_never_on_the_tpu_api(
    stage_stack: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cloud, env = stage_stack
    result, _ = run_dag(stage_stack, tmp_path, timeout=300, **CONF, gke_cluster="ironwood")
    assert result.state == "success", result.log[-3000:]
    assert (
        f"Plan only: would provision tpu7x-8 in us-central1-a with runtime {IMAGE} (platform gke); nothing was created."
        in result.log
    ), result.log[-3000:]

    # the plan's runtime check (Airflow's record of when it ran) asked GKE for the cluster, and nothing else
    asked = _asked_while(cloud, _task_window(env, result.run_id, "validate_runtime"))
    cluster = f"/locations/{LOCATION}/clusters/ironwood"
    assert [a for a in asked if a[0] == "GET" and _api(a[1]) == "container" and a[1].endswith(cluster)], asked
    assert [a for a in asked if _api(a[1]) != "container"] == [], asked
    # and in the whole run, nothing but reads of the TPU API, Compute Engine and GKE (a create is a POST)
    assert [r for r in cloud.admin.requests() if r["method"] != "GET"] == []
    _nothing_created(cloud)
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    assert _pools(cloud, "ironwood") == ["default-pool"]


def test_a_cluster_older_than_ironwood_is_refused_naming_gke_cluster_before_anything_is_created(
    stage_stack: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cloud, env = stage_stack
    result, _ = run_dag(stage_stack, tmp_path, timeout=300, **{**CONF, "plan_only": False}, gke_cluster="older")
    assert result.state == "failed", result.log[-3000:]
    assert "gke_cluster: older: tpu7x needs GKE 1.34.0-gke.2201000 or later on Standard clusters" in result.log
    _nothing_created(cloud)
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    assert _pools(cloud, "older") == ["default-pool"]
