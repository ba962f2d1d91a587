"""Issue 35's last GKE must-show: a stockout of the GKE TPU pool walks the tree to a GPU pool and the run resumes
from the portable checkpoint.

The training DAG (``airflow dags test``) with ``platforms [gke]``, a portable model (reference-portable: TPU
first, then GPUs) and ``tpu_types [v6e-4]`` on the local GKE. Two ways the TPU pool is lost:

- at provisioning: the zone has no ct6e-standard-4t (the local GKE's stockout), so the node pool create ends as
  on Google (operation error ``[GCE_STOCKOUT] ... does not have enough resources available``) and the run trains
  on a GPU pool instead;
- mid-run: the TPU node goes through a maintenance that replaces its VM while the zone has none left; the pod
  commits at SIGTERM, the cluster autoscaler cannot get the node back (``FailedScaleUp ... GCE out of
  resources`` on the pending pod), the stage moves the run to a GPU pool and the workload resumes there from the
  step the TPU pod committed.

Judged from independent facts: the local cloud's Container API log (the failed create), its GKE event log and
request log (in order: GKE evicted the run's pod from the run's TPU node, the autoscaler's scale-up of the TPU pool
failed and no node of it came back, and only then was the GPU pool asked for and the JobSet's new pod placed on it;
names from the cloud's own listings), the workload's own log in GCS (where each start resumed, the last step each
process computed), the final weights' digest against an uninterrupted reference run (the reference trainer is
bit-for-bit on either family here, as test_failover's TPU -> GPU move asserts), and, counted in the local
Kubernetes and Container APIs after the run, no JobSet, pod or node pool of the run left.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from interlude.stage.jobset import short_name
from interlude.training import events as run_events
from interlude_dev import scenario
from interlude_dev import wiring as dev

from .stage_fixtures import BUCKET, final_digest, reference, run_dag, store, workload_log
from .test_gke_jobset_stage import CLUSTER, GKE_CONF, JS, _pools, _segments

pytestmark = pytest.mark.e2e

ZONE, TPU_MACHINE = "us-central1-a", "ct6e-standard-4t"
FALLBACK_CONF: dict[str, Any] = {**GKE_CONF, "model_profile": "reference-portable"}


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    """The GKE stage's cloud (a CPU pool only: the run creates its pools) whose zone sells ct6e-standard-4t and
    the GPU machine types the portable profile asks for."""
    changes = {
        "time_scale": 1800,
        "zones": {ZONE: {"gpu": {"tpu_machine_types": [TPU_MACHINE]}}},
        "gke": scenario.gke(scenario.gke_cluster(CLUSTER, "us-central1")),
    }
    return scenario.build(tmp_path / "gke.yaml", "default", changes)


def _moves(cloud: dev.LocalCloud, run_key: str) -> list[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", cloud.gcs_endpoint)
        return [e for e in run_events.load_events(BUCKET, run_key) if e.get("kind") == "move"]


def _nothing_left(hook: Any, api: k8s.ApiClient, run_key: str) -> None:
    """No JobSet, Job or pod, and no node pool of the run (the TPU pool nor the GPU pool), in the cluster's APIs."""
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    assert custom.list_namespaced_custom_object(**JS, namespace="default")["items"] == []
    assert core.list_namespaced_pod("default").items == []
    assert k8s.BatchV1Api(api).list_namespaced_job("default").items == []
    assert _pools(hook) == ["default-pool"], "the run's node pools are gone, the cluster's own stays"
    assert not [
        n.metadata.name
        for n in core.list_node().items
        if (n.metadata.labels or {}).get("cloud.google.com/gke-nodepool", "").startswith(short_name(run_key))
    ]


def _accelerators_run_on(
    api: k8s.ApiClient, seen: dict[str, set[str]], stop: threading.Event, pools: dict[str, str] | None = None
) -> threading.Thread:
    """Record the accelerator label of every node a pod of a JobSet ran on (GKE's own node labels), and in `pools`
    each such node's node pool (its ``cloud.google.com/gke-nodepool`` label)."""
    core = k8s.CoreV1Api(api)
    pools = {} if pools is None else pools

    def loop() -> None:
        while not stop.is_set():
            for pod in core.list_namespaced_pod("default", label_selector="jobset.sigs.k8s.io/jobset-name").items:
                if pod.status.phase == "Running" and pod.spec.node_name:
                    try:
                        labels = core.read_node(pod.spec.node_name).metadata.labels or {}
                    except k8s.ApiException:
                        continue
                    accel = labels.get("cloud.google.com/gke-tpu-accelerator") or labels.get(
                        "cloud.google.com/gke-accelerator"
                    )
                    seen.setdefault(pod.metadata.name, set()).add(str(accel))
                    pools[pod.spec.node_name] = str(labels.get("cloud.google.com/gke-nodepool"))
            stop.wait(0.3)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_a_stocked_out_tpu_pool_at_provisioning_walks_the_tree_to_a_gpu_pool(
    stage_stack: Any,
    kube: tuple[Any, k8s.ApiClient],
    tmp_path: Path,
) -> None:
    cloud, _ = stage_stack
    hook, api = kube
    cloud.admin.gke_stockout(ZONE, TPU_MACHINE)
    seen: dict[str, set[str]] = {}
    stop = threading.Event()
    watcher = _accelerators_run_on(api, seen, stop)
    result, run_key = run_dag(stage_stack, tmp_path, timeout=900, **FALLBACK_CONF)
    stop.set()
    watcher.join(timeout=5)
    assert result.succeeded, result.log[-6000:]

    # GKE's create of the TPU pool ended with the stockout (the local cloud's own log), and the run's trail says so
    done = [e for e in cloud.admin.events() if e.get("event") == "gke_operation_done" and e.get("error")]
    assert done and "GCE_STOCKOUT" in done[0]["error"] and done[0]["target"] == f"nodePools/{short_name(run_key)}"
    assert "Stockout" in result.log and "v6e-4" in result.log, result.log[-4000:]

    # the workload ran on GPU nodes only, and trained through both stages to the reference weights
    accelerators = set().union(*seen.values()) if seen else set()
    assert accelerators and all(a.startswith("nvidia-") for a in accelerators), seen
    assert final_digest(cloud, run_key) == reference(cloud)
    _nothing_left(hook, api, run_key)


def _lose_the_tpu_node_for_good(cloud: dev.LocalCloud, api: k8s.ApiClient, seen: dict[str, Any]) -> threading.Thread:
    """Once the train stage is past step 10 on the TPU pool: the zone has no ct6e-standard-4t left, and the node's VM
    is replaced at a maintenance window 2 s (1 scenario hour) after the notice: the pool cannot get a node back."""
    core = k8s.CoreV1Api(api)

    def loop() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and "window" not in seen:
            for pod in core.list_namespaced_pod("default", label_selector="jobset.sigs.k8s.io/jobset-name").items:
                if pod.status.phase != "Running" or not pod.spec.node_name:
                    continue
                run_key = pod.metadata.labels.get("interlude-run", "")
                progress = store(cloud, run_key, "train").read_progress() or {}
                if int(progress.get("step") or 0) >= 10:
                    seen.update(pod=pod.metadata.name, node=pod.spec.node_name, run_key=run_key)
                    cloud.admin.gke_stockout(ZONE, TPU_MACHINE)
                    seen["window"] = cloud.admin.gke_node_maintenance_window(
                        CLUSTER,
                        pod.spec.node_name,
                        notice_in=0,
                        window_in=3600,
                        drain_seconds=1800,
                        duration_seconds=3600,
                        replaces_node=True,
                    )
                    break
            time.sleep(0.3)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _evicted_then_scale_up_failed_then_gpu_pool(
    cloud: dev.LocalCloud, api: k8s.ApiClient, run_key: str, seen: dict[str, Any], node_pools: dict[str, str]
) -> None:
    """In the local cloud's own logs, in this order (GKE's event log: its list order and wall clock ``at``; the
    cloud's request and event logs: the same clock):

    1. GKE evicted the run's pod from the run's TPU node (both names as the Kubernetes API listed them);
    2. the cluster autoscaler's scale-up of the run's TPU pool failed (GCE_STOCKOUT; the pending pod's
       ``FailedScaleUp`` Event) and no node of that pool was added after the eviction;
    3. only after that failure was any node pool asked for (Container API create) - the run's GPU pool, created
       without error - and the JobSet's new pod placed on a node of it.
    """
    tpu_pool = short_name(run_key)
    assert node_pools.get(seen["node"]) == tpu_pool, (seen, node_pools)
    events = cloud.admin.gke_events(CLUSTER)["events"]
    evictions = [
        i
        for i, e in enumerate(events)
        if e["kind"] == "Evicted" and e.get("pod") == seen["pod"] and e.get("node") == seen["node"]
    ]
    assert evictions, f"GKE never evicted the run's pod {seen['pod']} from {seen['node']}: {events[-30:]}"
    evicted_at = events[evictions[0]]["at"]
    after = events[evictions[0] + 1 :]
    failed = [e for e in after if e["kind"] == "ScaleUpFailed" and e.get("pool") == tpu_pool]
    assert failed and "GCE_STOCKOUT" in failed[0]["reason"], f"no failed scale-up of {tpu_pool}: {after[-30:]}"
    assert not [e for e in after if e["kind"] == "ScaleUp" and e.get("pool") == tpu_pool], after
    failed_at = failed[0]["at"]
    core = k8s.CoreV1Api(api)
    notes = [ev for ev in core.list_namespaced_event("default").items if ev.reason == "FailedScaleUp"]
    assert [ev for ev in notes if ev.involved_object.name.startswith(tpu_pool)], notes

    creates = [
        r
        for r in cloud.admin.requests(evicted_at)
        if r["method"] == "POST" and r["path"].endswith(f"/clusters/{CLUSTER}/nodePools")
    ]
    assert creates, "no node pool was asked for after the eviction"
    early = [r for r in creates if r["t"] <= failed_at]
    assert not early, f"a node pool was asked for before the autoscaler's scale-up failed: {early} vs {failed[0]}"
    made = [
        e
        for e in cloud.admin.events(evicted_at)
        if e["event"] == "gke_operation_done" and e["type"] == "CREATE_NODE_POOL"
    ]
    assert len(made) == 1 and made[0]["error"] is None, made
    gpu_pool = made[0]["target"].rsplit("/", 1)[-1]
    assert gpu_pool != tpu_pool and gpu_pool.startswith(tpu_pool), made
    placed = [e for e in after if e["kind"] == "Scheduled" and node_pools.get(e.get("node", "")) == gpu_pool]
    assert placed and placed[0]["at"] > failed_at, (placed, failed[0])


def test_a_tpu_pool_that_cannot_get_its_node_back_moves_to_a_gpu_pool_and_resumes_from_the_tpu_checkpoint(
    stage_stack: Any,
    kube: tuple[Any, k8s.ApiClient],
    tmp_path: Path,
) -> None:
    cloud, _ = stage_stack
    hook, api = kube
    seen: dict[str, Any] = {}
    ran: dict[str, set[str]] = {}
    node_pools: dict[str, str] = {}
    stop = threading.Event()
    loser = _lose_the_tpu_node_for_good(cloud, api, seen)
    watcher = _accelerators_run_on(api, ran, stop, node_pools)
    result, run_key = run_dag(stage_stack, tmp_path, timeout=900, **FALLBACK_CONF)
    stop.set()
    loser.join(timeout=5)
    watcher.join(timeout=5)
    assert result.succeeded, result.log[-6000:]
    assert seen.get("run_key") == run_key, f"the TPU node was never lost under the run: {seen}"

    # the cloud's own logs: the autoscaler could not get the TPU node back, and only then did the run go to a GPU pool
    _evicted_then_scale_up_failed_then_gpu_pool(cloud, api, run_key, seen, node_pools)
    moves = _moves(cloud, run_key)  # and the run's own trail says the same
    assert len(moves) == 1 and moves[0]["cross_family"] is True, moves
    assert moves[0]["from_type"] == "v6e-4" and moves[0]["to"].startswith("nvidia-"), moves

    # a TPU pod trained first, a GPU pod after
    kinds = [a for accels in ran.values() for a in accels]
    assert "tpu-v6e-slice" in kinds and any(a.startswith("nvidia-") for a in kinds), ran

    # the workload's own log: the GPU pod's start resumed right after the TPU pod's last computed step
    log = workload_log(cloud, run_key, "train")
    assert "SIGTERM received" in log, log[-3000:]
    segments = _segments(log, "train", 60)
    assert len(segments) >= 2 and segments[0][0] == 1 and segments[-1][1] == 60, segments
    for (_, last), (first, _) in zip(segments, segments[1:], strict=False):
        assert first == last + 1, f"0 steps recomputed: a start at {first} after {last}\n{log[-3000:]}"
    assert segments[0][1] >= 10, segments  # the TPU pod's checkpoint is what the GPU pod resumed from

    report = dev.read_report(cloud, BUCKET, run_key)
    assert report is not None and report["steps_recomputed"] == 0, report

    # the fine-tuned weights are the uninterrupted run's
    assert final_digest(cloud, run_key) == reference(cloud)
    _nothing_left(hook, api, run_key)
