"""Issue 35: a TPU7x run is planned on GKE, never on the Cloud TPU API or Compute Engine, and a cluster whose GKE
version predates Ironwood is refused before anything is created, naming ``gke_cluster``.

``airflow dags test`` with ``plan_only`` on the local cloud, whose us-central1-a sells v6e through the TPU API and
lists ``tpu7x-standard-4t`` (Ironwood's 4-chip VM) for GKE node pools; two clusters there: one at a GKE version
that runs Ironwood (1.34.0-gke.2201000 or later on Standard, Google's Ironwood page) and one before it. Judged
from the DAG's own plan line and task states, and the cloud's own event log (no create of any kind, no node pool
operation) and its node pools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from interlude_dev import wiring as dev

from .stage_fixtures import (  # noqa: F401 - fixtures
    run_dag,
    stage_airflow_db,
    stage_stack,
)

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
    data = yaml.safe_load((dev.SCENARIOS / "default.yaml").read_text())
    data["time_scale"] = 1800
    data["zones"]["us-central1-a"]["gpu"]["tpu_machine_types"] = ["tpu7x-standard-4t"]
    data["gke"] = {
        "clusters": [
            {
                "name": name,
                "location": LOCATION,
                "kubernetes_version": version,
                "node_pools": [
                    {"name": "default-pool", "machine_type": "e2-standard-4", "initial_nodes": 1, "max_nodes": 1}
                ],
            }
            for name, version in CLUSTERS.items()
        ],
    }
    path = tmp_path / "tpu7x.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _pools(cloud: dev.LocalCloud, cluster: str) -> list[str]:
    from interlude.hooks.gke import GKEHook

    hook = GKEHook(gcp_conn_id="google_cloud_default", location=LOCATION)
    parent = f"projects/{hook.project_id}/locations/{LOCATION}/clusters/{cluster}"
    return [p.name for p in hook.get_cluster_manager_client().list_node_pools(parent=parent).node_pools]


def _nothing_created(cloud: dev.LocalCloud) -> None:
    events = cloud.admin.events()
    assert [e for e in events if e["event"] in CREATES] == []
    assert [e for e in events if e["event"].startswith("gke_operation")] == []
    assert dev.machines(cloud) == []


def test_a_tpu7x_run_is_planned_on_gke_and_never_on_the_tpu_api(
    stage_stack: Any,  # noqa: F811
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
    _nothing_created(cloud)
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    assert _pools(cloud, "ironwood") == ["default-pool"]


def test_a_cluster_older_than_ironwood_is_refused_naming_gke_cluster_before_anything_is_created(
    stage_stack: Any,  # noqa: F811
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
