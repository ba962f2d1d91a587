"""The sweeper on GKE: `airflow dags test interlude_sweeper` with ``gke_clusters`` deletes the node pool and JobSet
of a finished run and keeps a running run's, asking Airflow for each run's state (the runs are real rows of
Airflow's DB, made with `airflow dags trigger`; the pools and JobSets are made exactly as `provision` makes them).
The Container and Kubernetes APIs' own lists are what is asserted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from interlude import naming
from interlude.machines import gke
from interlude.stage.jobset import short_name
from interlude.training.spec import RunSpec
from tests.faults.support import ZONES, dags_test, runs_in_states

from .stage_fixtures import BASE, DAG_ID
from .test_gke_jobset_stage import CLUSTER, GKE_CONF, JS, LOCATION, _pools, gke_scenario

pytestmark = pytest.mark.e2e


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    """The JobSet stage's cloud (tests/faults/test_gke_jobset_stage.py): one GKE cluster, a CPU pool only."""
    return gke_scenario(tmp_path)


def test_the_sweeper_deletes_a_finished_runs_node_pool_and_jobset_and_keeps_a_running_runs(
    stage_stack: Any,
    kube: tuple[Any, k8s.ApiClient],
    tmp_path: Path,
) -> None:
    _, env = stage_stack
    hook, api = kube
    runs_in_states(env, DAG_ID, {"gke-finished": "failed", "gke-running": "running"})
    specs = {
        run_id: RunSpec.from_params(
            {**BASE, **GKE_CONF}, dag_id=DAG_ID, run_id=run_id, run_key=naming.run_key(DAG_ID, run_id)
        )
        for run_id in ("gke-finished", "gke-running")
    }
    names = {run_id: short_name(spec.run_key) for run_id, spec in specs.items()}
    custom = k8s.CustomObjectsApi(api)
    try:
        for spec in specs.values():
            machine = gke.machine_record(spec, {"accelerator_type": "v6e-4", "zone": GKE_CONF["zones"][0]})
            gke.provision(spec, machine, "google_cloud_default")
        assert sorted(_pools(hook)) == sorted(["default-pool", *names.values()])

        conf = {"zones": list(ZONES), "gke_clusters": [f"{LOCATION}/{CLUSTER}"]}
        run = dags_test(env, "interlude_sweeper", conf, tmp_path / "sweeper.log")

        assert run.state == "success", run.log[-4000:]
        assert sorted(_pools(hook)) == ["default-pool", names["gke-running"]], run.log[-3000:]
        jobsets = [
            j["metadata"]["name"] for j in custom.list_namespaced_custom_object(**JS, namespace="default")["items"]
        ]
        assert jobsets == [names["gke-running"]]
        assert f"delete: run gke-finished of {DAG_ID} is failed" in run.log
        assert f"keep: run gke-running of {DAG_ID} is running" in run.log
    finally:
        for spec in specs.values():
            gke.teardown(spec, "google_cloud_default")
    assert _pools(hook) == ["default-pool"]
    assert os.environ.get("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT")
