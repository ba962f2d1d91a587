"""Issue 35's GKE must-show: the training DAG (``airflow dags test``) on the local GKE trains and fine-tunes in a
v6e JobSet through a scheduled node maintenance: GKE labels the node at the notice (Interlude asks for a
checkpoint), drains it at the window (the workload commits on SIGTERM), the JobSet recreates the pod once the
node is back and the workload resumes where it stopped.

Judged from independent facts: the workload's own log in GCS (where each start resumed, the last step each
process computed, the SIGTERM), the local cloud's GKE event log (the node went through its maintenance, the pod
was evicted by it), the final weights' digest against an uninterrupted reference run, and, counted in the local
Kubernetes and Container APIs after the run, no JobSet, pod or node pool of the run left. The default
maintenance policy: the label holds epoch seconds as on Google.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from interlude.stage.jobset import short_name
from interlude_dev import scenario
from interlude_dev import wiring as dev

from .stage_fixtures import BUCKET, drilled_stages, final_digest, reference, run_dag, store, workload_log

pytestmark = pytest.mark.e2e

CLUSTER, LOCATION = "interlude-train", "us-central1"
IMAGE = "us-docker.pkg.dev/interlude-local/interlude/workload:1"
GKE_CONF: dict[str, Any] = {
    "platforms": ["gke"],
    "gke_cluster": CLUSTER,
    "gke_location": LOCATION,
    "gke_image": IMAGE,
    "tpu_types": ["v6e-4"],
    "zones": ["us-central1-a"],
}
SCHEDULED = "cloud.google.com/scheduled-maintenance-time"
JS = {"group": "jobset.x-k8s.io", "version": "v1alpha2", "plural": "jobsets"}


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    return gke_scenario(tmp_path)


def gke_scenario(tmp_path: Path) -> Path:
    """The fault suite's fast default cloud plus a GKE cluster (a CPU pool only: the run creates its TPU pool),
    its pods running the project's python for the workload's image."""
    changes = {
        # the zone sells v6e-4 VMs (ct6e-standard-4t): what a GKE TPU pool of that shape is made of (the probe asks)
        "zones": {"us-central1-a": {"gpu": {"tpu_machine_types": ["ct6e-standard-4t"]}}},
        "gke": scenario.gke(scenario.gke_cluster(CLUSTER, LOCATION)),
    }
    return scenario.build(tmp_path / "gke.yaml", "default", scenario.FAST, changes)


def _pools(hook: Any) -> list[str]:
    parent = f"projects/{hook.project_id}/locations/{LOCATION}/clusters/{CLUSTER}"
    return [p.name for p in hook.get_cluster_manager_client().list_node_pools(parent=parent).node_pools]


def _maintain_when_training(cloud: dev.LocalCloud, api: k8s.ApiClient, seen: dict[str, Any]) -> threading.Thread:
    """Once the train stage is past step 10 in the JobSet's pod: a scheduled maintenance of that pod's node, its
    window 2 s (1 scenario hour) after the notice (>= 4 s of the stage's paced steps are left), the host down 2 s."""
    core = k8s.CoreV1Api(api)

    def loop() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and "window" not in seen:
            pods = core.list_namespaced_pod("default", label_selector="jobset.sigs.k8s.io/jobset-name").items
            running = [p for p in pods if p.status.phase == "Running" and p.spec.node_name]
            for pod in running:
                run_key = pod.metadata.labels.get("interlude-run", "")
                progress = store(cloud, run_key, "train").read_progress() or {}
                if int(progress.get("step") or 0) >= 10:
                    seen.update(pod=pod.metadata.name, node=pod.spec.node_name, uid=pod.metadata.uid, run_key=run_key)
                    seen["asked_at"] = time.time()
                    seen["window"] = cloud.admin.gke_node_maintenance_window(
                        CLUSTER,
                        pod.spec.node_name,
                        notice_in=0,
                        window_in=3600,
                        drain_seconds=1800,
                        duration_seconds=3600,
                    )
                    until = time.monotonic() + 60  # the controller labels the node on its next pass
                    while time.monotonic() < until and SCHEDULED not in seen.get("label", {}):
                        seen["label"] = core.read_node(pod.spec.node_name).metadata.labels or {}
                        time.sleep(0.05)
                    break
            time.sleep(0.3)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _listed(api: k8s.ApiClient, pods: dict[str, dict[str, str]], stop: threading.Event) -> threading.Thread:
    """Record, as the Kubernetes API lists them, every JobSet pod bound to a node (its run label and node) and that
    node's node pool label: the names the cloud's event log is then read against."""
    core = k8s.CoreV1Api(api)

    def loop() -> None:
        while not stop.is_set():
            try:
                listed = core.list_namespaced_pod("default", label_selector="jobset.sigs.k8s.io/jobset-name").items
                for pod in listed:
                    if pod.spec.node_name and pod.metadata.name not in pods:
                        labels = core.read_node(pod.spec.node_name).metadata.labels or {}
                        pods[pod.metadata.name] = {
                            "run_key": (pod.metadata.labels or {}).get("interlude-run", ""),
                            "node": pod.spec.node_name,
                            "pool": labels.get("cloud.google.com/gke-nodepool", ""),
                        }
            except k8s.ApiException:  # a pod or node went away between the two reads: the next pass sees the rest
                pass
            stop.wait(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _drill_evicted_the_runs_pod(
    drill: dict[str, Any], events: list[dict[str, Any]], pods: dict[str, dict[str, str]], run_key: str
) -> str:
    """The drilled node is a node of the run's own pool, and GKE evicted from it the run's pod that was running
    there when the drill was sent, in this order: the drill (the cloud's event log), the node's maintenance
    scheduled, then the eviction of that pod from that node by the maintenance's drain. Names and pools as
    the Kubernetes API listed them; GKE's event log in its own order and wall clock (``at``). The pod's name."""
    node = drill["node"]
    ours = {name for name, p in pods.items() if p["run_key"] == run_key and p["node"] == node}
    assert ours and {pods[n]["pool"] for n in ours} == {short_name(run_key)}, (drill, pods)
    placed = [e for e in events if e["kind"] == "Scheduled" and e.get("node") == node and e["at"] < drill["t"]]
    assert placed and placed[-1]["pod"] in ours, f"no pod of the run on {node} at the drill: {placed}, {ours}"
    pod = placed[-1]["pod"]

    def first(kind: str, after: int, **match: Any) -> int:
        found = [
            i
            for i, e in enumerate(events)
            if i > after and e["kind"] == kind and all(e.get(k) == v for k, v in match.items())
        ]
        assert found, f"no {kind} {match} after #{after}: {events[after + 1 :][-30:]}"
        return found[0]

    drilled = sum(1 for e in events if e["at"] < drill["t"]) - 1  # the last GKE event before the drill
    scheduled = first("NodeMaintenance", drilled, node=node, phase="scheduled")
    # the drain's eviction carries its phase's reason (GKE's log keeps a repeated "terminating" of the same node once)
    evicted = events[first("Evicted", scheduled, node=node, pod=pod)]
    assert evicted["reason"] == "maintenance started: draining pods", evicted
    return pod


def _segments(log: str, stage: str, steps: int) -> list[tuple[int, int]]:
    """Each start of the stage's trainer in its own log: (first step it computed, last step it computed)."""
    out = []
    for part in re.split(rf"(?=training {stage} steps \d+\.\.)", log)[1:]:
        first = int(re.match(rf"training {stage} steps (\d+)\.\.", part).group(1))  # type: ignore[union-attr]
        done = [int(s) for s in re.findall(rf"step (\d+)/{steps} loss", part)]
        out.append((first, max(done, default=first - 1)))
    return out


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "on-the-worker"])
def test_a_v6e_jobset_trains_and_fine_tunes_through_a_scheduled_node_maintenance(
    stage_stack: Any,
    kube: tuple[Any, k8s.ApiClient],
    tmp_path: Path,
    deferrable: bool,
) -> None:
    """deferred: the stages watch from the triggerer; on-the-worker (``deferrable=False``): the same trigger loop
    and decisions on the worker, nothing deferred."""
    cloud, _ = stage_stack
    hook, api = kube
    seen: dict[str, Any] = {}
    watcher = _maintain_when_training(cloud, api, seen)
    env = {} if deferrable else {"AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False"}
    result, run_key = run_dag(stage_stack, tmp_path, env=env, timeout=900, **GKE_CONF)
    watcher.join(timeout=5)
    assert result.succeeded, result.log[-6000:]
    assert ("DEFERRED" in result.log) is deferrable, "the stages defer exactly when deferrable"
    assert seen.get("run_key") == run_key, f"the maintenance never reached the run's pod: {seen}"

    # GKE's label at the notice: Unix epoch seconds of the window, as Google writes it: of the wall clock (not the
    # cluster's faster scenario clock), after the ask, and not after the moment the window opened on the node
    label = int(seen["label"][SCHEDULED])
    assert label == int(seen["window"]["window_start_epoch"]), seen
    events = cloud.admin.gke_events(CLUSTER)["events"]
    maintenance = [e for e in events if e["kind"] == "NodeMaintenance" and e.get("node") == seen["node"]]
    opened = next(e for e in maintenance if e.get("phase") == "terminating")
    assert seen["asked_at"] <= label <= opened["at"], (seen, opened)

    # the node went through its maintenance and GKE (not Interlude) evicted the pod at the window
    phases = {e.get("phase") for e in maintenance}
    assert {"scheduled", "terminating", "done"} <= phases, events[-30:]
    assert [e for e in events if e["kind"] == "Evicted" and e.get("pod") == seen["pod"]], events[-30:]

    # the workload's own log: it took the SIGTERM, committed, and the next start resumed right after its last step
    log = workload_log(cloud, run_key, "train")
    assert "SIGTERM received" in log, log[-3000:]
    segments = _segments(log, "train", 60)
    assert len(segments) >= 2, segments
    for (_, last), (first, _) in zip(segments, segments[1:], strict=False):
        assert first == last + 1, f"0 steps recomputed: a start at {first} after {last}\n{log[-3000:]}"
    assert segments[-1][1] == 60 and segments[0][0] == 1, segments

    # the report's maintenance event says the same
    report = dev.read_report(cloud, BUCKET, run_key)
    assert report is not None
    print(json.dumps(report["events"], indent=1, sort_keys=True))
    (event,) = [e for e in report["events"] if e["stage"] == "train"]
    assert event["kind"] == "maintenance" and event["platform"] == "gke" and event["node"] == seen["node"]
    assert event["steps_recomputed"] == 0 and report["steps_recomputed"] == 0, event
    assert event["resumed_from_step"] == segments[1][0] - 1, (event, segments)
    assert event["window_start"] == label and event["downtime_s"] > 0, event

    # the fine-tuned weights are the uninterrupted run's
    assert final_digest(cloud, run_key) == reference(cloud)

    # nothing of the run left, counted in the cluster's own APIs
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    assert custom.list_namespaced_custom_object(**JS, namespace="default")["items"] == []
    assert core.list_namespaced_pod("default").items == []
    assert k8s.BatchV1Api(api).list_namespaced_job("default").items == []
    assert _pools(hook) == ["default-pool"], "the run's node pool is gone, the cluster's own stays"
    assert short_name(run_key) not in {
        n.metadata.labels.get("cloud.google.com/gke-nodepool") for n in core.list_node().items
    }
    assert os.environ.get("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT")


def test_a_drill_on_gke_goes_to_the_pods_node_in_each_stage_and_resumes_where_the_workload_held(
    stage_stack: Any,
    kube: tuple[Any, k8s.ApiClient],
    tmp_path: Path,
) -> None:
    """``drill_maintenance`` on GKE: the workload holds at the drill step, Interlude has Compute Engine simulate a
    host maintenance on the VM under the pod's node, GKE labels the node, drains it at the window and the JobSet's
    new pod resumes at the held step. Judged from the cloud's own logs (a Compute simulateMaintenanceEvent on a
    node of the run's pool per stage, the node's maintenance, then GKE's eviction of the run's pod that ran on that
    node, in that order; pod, node and pool names as the Kubernetes API listed them) and the workload's own log."""
    cloud, _ = stage_stack
    hook, api = kube
    pods: dict[str, dict[str, str]] = {}
    stop = threading.Event()
    lister = _listed(api, pods, stop)
    result, run_key = run_dag(stage_stack, tmp_path, timeout=900, drill_maintenance=True, **GKE_CONF)
    stop.set()
    lister.join(timeout=5)
    assert result.succeeded, result.log[-6000:]

    drills = [e for e in cloud.admin.events() if e["event"] == "gke_node_maintenance"]
    assert len(drills) == 2, f"one simulated maintenance per stage: {drills}"
    events = cloud.admin.gke_events(CLUSTER)["events"]
    evicted = [_drill_evicted_the_runs_pod(drill, events, pods, run_key) for drill in drills]
    assert len(set(evicted)) == 2, f"each drill evicted a pod of its own stage: {evicted}"

    for event, held, resumed in drilled_stages(cloud, run_key).values():
        assert event["platform"] == "gke", event
        assert event["node"] in {d["node"] for d in drills}, (event, drills)
        assert event["resumed_from_step"] == held[0] and held[0] in resumed, (held, resumed, event)
        assert event["steps_recomputed"] == 0 and event["downtime_s"] > 0, event
    assert final_digest(cloud, run_key) == reference(cloud)

    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    assert custom.list_namespaced_custom_object(**JS, namespace="default")["items"] == []
    assert core.list_namespaced_pod("default").items == []
    assert _pools(hook) == ["default-pool"], "the run's node pool is gone, the cluster's own stays"


def test_a_cluster_that_does_not_exist_is_refused_naming_the_param_before_anything_is_created(
    stage_stack: Any,
    kube: tuple[Any, k8s.ApiClient],
    tmp_path: Path,
) -> None:
    hook, api = kube
    result, _ = run_dag(stage_stack, tmp_path, timeout=600, **{**GKE_CONF, "gke_cluster": "no-such-cluster"})
    assert result.state == "failed", result.log[-3000:]
    assert "gke_cluster: 'no-such-cluster'" in result.log, result.log[-3000:]
    assert "Creating node pool" not in result.log
    assert _pools(hook) == ["default-pool"]
    assert k8s.CustomObjectsApi(api).list_namespaced_custom_object(**JS, namespace="default")["items"] == []


def test_a_jobset_deleted_under_the_run_fails_the_stage_and_teardown_still_leaves_nothing(
    stage_stack: Any,
    kube: tuple[Any, k8s.ApiClient],
    tmp_path: Path,
) -> None:
    """Someone deletes the run's JobSet mid-training: the stage fails saying so (never waits for it forever), the
    run stays failed, and teardown still removes the node pool and confirms no pod or JobSet is left."""
    cloud, _ = stage_stack
    hook, api = kube
    custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
    deleted: list[str] = []

    def delete_when_training() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not deleted:
            for js in custom.list_namespaced_custom_object(**JS, namespace="default")["items"]:
                run_key = js["metadata"]["labels"]["interlude-run"]
                if int((store(cloud, run_key, "train").read_progress() or {}).get("step") or 0) >= 10:
                    custom.delete_namespaced_custom_object(**JS, namespace="default", name=js["metadata"]["name"])
                    deleted.append(run_key)
            time.sleep(0.3)

    thread = threading.Thread(target=delete_when_training, daemon=True)
    thread.start()
    result, run_key = run_dag(stage_stack, tmp_path, timeout=600, **GKE_CONF)
    thread.join(timeout=5)
    assert deleted == [run_key], deleted
    assert result.state == "failed", result.log[-3000:]
    assert "the JobSet is gone" in result.log, result.log[-3000:]
    assert store(cloud, run_key, "finetune").latest().checkpoint is None, "nothing ran after the failed stage"
    assert custom.list_namespaced_custom_object(**JS, namespace="default")["items"] == []
    assert core.list_namespaced_pod("default").items == []
    assert _pools(hook) == ["default-pool"]
