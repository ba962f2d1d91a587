"""GKE runs: the guide's TPU-first / L4-fallback example with real processes (the vLLM stand-in behind the
entrypoint scripts Interlude ships) on the local cloud, asserting facts read from the cluster and the pods."""

from __future__ import annotations

import copy
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
import yaml

from interlude.serving.entrypoints import load_scripts
from interlude.serving.plan import require_plan
from interlude.serving.spec import ServeSpec
from interlude_localcloud.gke.controllers import CLASSES, NODES, PODS
from interlude_localcloud.gke.deployments import DEPLOYMENTS
from interlude_localcloud.gke.hpa_controller import HPAS
from interlude_localcloud.gke.kubelet import CONFIGMAPS
from interlude_localcloud.gke.runtime import PORT_ANNOTATION, SERVICES
from interlude_localcloud.testing import running_localcloud

from ...serving.standin_proc import make_export, upload_export

DEADLINE = 120.0  # generous: pods are processes, and a loaded 2-core machine is slow to start them


def wait_for(what: str, check: Callable[[], Any], c: Any, timeout: float = DEADLINE) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}\n{explain(c)}")


def explain(c: Any) -> str:
    """The cluster's account, for a failure message only (assertions read the cluster)."""
    store = c.kube.store
    pods, _ = store.list(PODS, None)
    lines = [f"events: {c.runtime.controllers.state.events[-15:]}"]
    for p in pods:
        lines.append(f"pod {p['metadata']['name']} node={p['spec'].get('nodeName')} status={p.get('status')}")
        lines.extend(f"   | {line}" for line in store.logs.get(("default", p["metadata"]["name"]), [])[-15:])
    return "\n".join(lines)


def _objects(
    uri: str, kinds: frozenset[str] = frozenset({"ComputeClass", "ConfigMap", "Deployment", "Service"})
) -> list[dict[str, Any]]:
    result = require_plan(ServeSpec(checkpoint_uri=uri), scripts=load_scripts())
    objs = [o for o in yaml.safe_load_all(result.text) if o]
    out = [copy.deepcopy(o) for o in objs if o["kind"] in kinds]
    for o in out:
        if o["kind"] == "Deployment":
            # The rendered pod requests cpu 1 and no google.com/tpu, so every replica would fit on the one
            # TPU node; 6 of the 8 cores (5 + 1) keep one replica per node, as a TPU chip does on Google.
            o["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "5"
            o["spec"]["replicas"] = 1
    return out


BY_KIND = {
    "ComputeClass": CLASSES,
    "ConfigMap": CONFIGMAPS,
    "Deployment": DEPLOYMENTS,
    "Service": SERVICES,
    "HorizontalPodAutoscaler": HPAS,
}


@pytest.fixture
def cluster(bucket: str, tmp_path: Any) -> Iterator[tuple[Any, Any, str]]:
    from interlude_workload.gcs import storage_client

    export = make_export(tmp_path / "export", seed=3)
    uri = upload_export(export, storage_client(), bucket, "interlude/gke-serve/finetune/export-00000005")
    with running_localcloud("gke_serving_run", gcs=False) as lc:
        c = next(iter(lc.cloud_gke().clusters.values()))
        store = c.kube.store
        for o in _objects(uri):
            store.create(BY_KIND[o["kind"]], o["metadata"].get("namespace", ""), o)
        yield lc, c, uri
    pids = c.runtime.pids()  # after the local cloud stopped: every container process it ever started
    assert pids, "no container process was started"
    alive = [p for p in pids if _alive(p)]
    assert not alive, f"processes outlived the local cloud: {alive}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie not yet reaped by its parent is dead too
        return f.read().split(")")[-1].split()[0] != "Z"


def ready_pods(store: Any) -> list[dict[str, Any]]:
    pods, _ = store.list(PODS, "default")
    return [
        p
        for p in pods
        if any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])
    ]


def node_labels(store: Any, name: str) -> dict[str, str]:
    return store.get(NODES, "", name)["metadata"]["labels"]


def accelerators(store: Any) -> list[str]:
    out = []
    for p in ready_pods(store):
        labels = node_labels(store, p["spec"]["nodeName"])
        out.append("tpu" if "cloud.google.com/gke-tpu-accelerator" in labels else "gpu")
    return sorted(out)


def service_answer(store: Any, timeout: float = DEADLINE) -> dict[str, Any]:
    """/v1/models through the Service. A Service's endpoints follow a pod's Ready condition a moment later (the
    runtime's next reconcile here, the endpoints controller and kube-proxy on Kubernetes); until then the port
    refuses or resets, so a client that just saw Ready retries, as it would on a cluster."""
    port = store.get(SERVICES, "default", "interlude-vllm")["metadata"]["annotations"][PORT_ANNOTATION]
    end = time.monotonic() + timeout
    while True:
        try:
            r = requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=10)
            r.raise_for_status()
            return r.json()
        except requests.ConnectionError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


def test_guide_example_tpu_first_then_l4(cluster: tuple[Any, Any, str]) -> None:
    lc, c, uri = cluster
    store = c.kube.store
    wait_for("one ready pod", lambda: len(ready_pods(store)) == 1, c)
    assert accelerators(store) == ["tpu"]
    pod = ready_pods(store)[0]
    labels = node_labels(store, pod["spec"]["nodeName"])
    assert labels["cloud.google.com/gke-tpu-topology"] == "1x1"
    assert labels["cloud.google.com/compute-class"] == "interlude-vllm"
    body = service_answer(store)
    assert uri.rstrip("/") in str(body), body
    tpu_node = pod["spec"]["nodeName"]
    zone = labels["topology.kubernetes.io/zone"]

    # Maintenance on the TPU node with TPUs stocked out in the zone: the label at the notice, the pod evicted
    # at the window, its replacement placed by the ComputeClass on its second priority (L4).
    lc.admin.gke_stockout(zone, labels["node.kubernetes.io/instance-type"])
    window = lc.admin.gke_node_maintenance_window(
        c.spec.name, tpu_node, notice_in=60, window_in=1800, duration_seconds=1800, replaces_node=True
    )
    label = wait_for("the maintenance label", lambda: _label(store, tpu_node, SCHEDULED), c)
    assert int(label) == int(window["window_start_epoch"])  # Unix epoch seconds of the wall clock, as on Google
    assert store.exists(PODS, "default", pod["metadata"]["name"]), "evicted before the window"
    wait_for("the pod evicted", lambda: not store.exists(PODS, "default", pod["metadata"]["name"]), c)
    wait_for("the replacement ready on L4", lambda: accelerators(store) == ["gpu"], c)
    # GKE moves to the ComputeClass's next priority when the first cannot take the pod (this scenario has no TPU
    # delay): the autoscaler's first word on the replacement is an L4 node for it, asked for at the eviction
    # or after; then the pod is bound to that pool's node (the cluster's own event log, in scenario time).
    events = lc.admin.gke_events(c.spec.name)["events"]
    evicted = next(e for e in events if e["kind"] == "Evicted" and e["pod"] == pod["metadata"]["name"])
    new_pod = ready_pods(store)[0]["metadata"]["name"]
    about_it = [e for e in events if e.get("pod") == new_pod or new_pod in str(e.get("reason") or "")]
    assert [(e["kind"], e.get("pool")) for e in about_it[:2]] == [("ScaleUp", "l4"), ("Scheduled", None)], about_it
    scaled_up, bound = about_it[:2]
    assert evicted["t"] <= scaled_up["t"] <= bound["t"], about_it
    assert node_labels(store, bound["node"])["cloud.google.com/gke-nodepool"] == "l4", bound
    print(f"replacement bound to L4 {bound['t'] - evicted['t']:.0f} scenario seconds after the eviction")
    assert "/models/export" in str(service_answer(store))  # the L4 image reads the export through its FUSE mount
    # The maintenance ends with the VM replaced; with the stockout on, a TPU scale-up fails and the pod stays.
    wait_for("the TPU node replaced", lambda: not store.exists(NODES, "", tpu_node), c)
    wait_for(
        "a failed TPU scale-up",
        lambda: any(
            e["kind"] == "ScaleUpFailed" and e["pool"] == labels["cloud.google.com/gke-nodepool"]
            for e in lc.admin.gke_events(c.spec.name)["events"]
        ),
        c,
    )
    assert accelerators(store) == ["gpu"]

    # Capacity back: activeMigration brings the pod back to the TPU pool.
    lc.admin.gke_stockout(zone, labels["node.kubernetes.io/instance-type"], stockout=False)
    wait_for("the pod back on TPU", lambda: accelerators(store) == ["tpu"] and len(_pods(store)) == 1, c)
    assert uri.rstrip("/") in str(service_answer(store))

    # Scaled to 3: the TPU pool holds one node, two pods land on L4 nodes.
    scale(store, 3)
    wait_for("3 ready pods", lambda: accelerators(store) == ["gpu", "gpu", "tpu"], c)
    gpu_nodes = {
        p["spec"]["nodeName"]
        for p in ready_pods(store)
        if "cloud.google.com/gke-accelerator" in node_labels(store, p["spec"]["nodeName"])
    }
    assert len(gpu_nodes) == 2
    assert all(node_labels(store, n)["cloud.google.com/gke-accelerator"] == "nvidia-l4" for n in gpu_nodes)
    fingerprints = {service_answer(store)["data"][0]["root"] for _ in range(6)}
    assert fingerprints <= {uri.rstrip("/"), "/models/export"}, fingerprints


SCHEDULED = "cloud.google.com/scheduled-maintenance-time"


def _label(store: Any, node: str, key: str) -> str | None:
    return store.get(NODES, "", node)["metadata"]["labels"].get(key) if store.exists(NODES, "", node) else None


def _pods(store: Any) -> list[dict[str, Any]]:
    return store.list(PODS, "default")[0]


def scale(store: Any, replicas: int) -> None:
    def mutate(cur: dict[str, Any]) -> dict[str, Any]:
        cur["spec"]["replicas"] = replicas
        cur["metadata"].pop("resourceVersion", None)
        return cur

    store.update(DEPLOYMENTS, "default", "interlude-vllm", mutate)


def test_hpa_scales_on_the_pods_waiting_requests(cluster: tuple[Any, Any, str]) -> None:
    """The rendered HPA (vllm:num_requests_waiting, AverageValue 1) scales up while requests queue in the
    stand-in (one sequence at a time, slow tokens) and back down after its stabilization window."""
    lc, c, uri = cluster
    store = c.kube.store
    wait_for("one ready pod", lambda: len(ready_pods(store)) == 1, c)
    hpa = next(o for o in _objects(uri, frozenset({"HorizontalPodAutoscaler"})))
    store.create(HPAS, "default", hpa)
    port = store.get(SERVICES, "default", "interlude-vllm")["metadata"]["annotations"][PORT_ANNOTATION]

    def complete() -> None:  # a pod migrated or removed mid-request drops its connections: that is fine here
        try:
            requests.post(
                f"http://127.0.0.1:{port}/v1/completions",
                timeout=120,
                json={"model": "interlude", "prompt": "hello", "max_tokens": 40},
            )
        except requests.RequestException:
            time.sleep(0.2)  # no pod answering right now: do not spin

    # the served pod queues: pace tokens and allow one sequence at a time (a new rollout of the template)
    def slow(cur: dict[str, Any]) -> dict[str, Any]:
        for ctr in cur["spec"]["template"]["spec"]["containers"]:
            ctr.setdefault("env", []).append({"name": "VLLM_STANDIN_SECONDS_PER_TOKEN", "value": "0.1"})
            ctr["args"] = [*ctr["args"], "--max-num-seqs=1"]
        cur["metadata"].pop("resourceVersion", None)
        return cur

    store.update(DEPLOYMENTS, "default", "interlude-vllm", slow)
    wait_for(
        "the slow pod ready alone",
        lambda: (
            len(_pods(store)) == 1
            and len(ready_pods(store)) == 1
            and any(
                e.get("name") == "VLLM_STANDIN_SECONDS_PER_TOKEN"
                for e in ready_pods(store)[0]["spec"]["containers"][0].get("env") or []
            )
        ),
        c,
    )
    # Five clients keep the queue full until the HPA acts: one burst could drain before a loaded machine's
    # HPA pass saw it (or meet the pod mid-migration and fail fast), and then nothing ever queues again.
    scaled = threading.Event()

    def keep_loading() -> None:
        while not scaled.is_set():
            complete()

    load = [threading.Thread(target=keep_loading, daemon=True) for _ in range(5)]
    for t in load:
        t.start()
    # The controller scales the Deployment, then writes its own status (as kube's HPA controller does: the scale
    # update, then updateStatusIfNeeded), so a look between the two sees the new replicas beside the old status.
    seen: list[dict[str, Any]] = []

    def scaled_up() -> bool:
        seen.append(store.get(HPAS, "default", "interlude-vllm").get("status") or {})
        return replicas(store) > 1 and seen[-1].get("desiredReplicas", 0) > 1

    try:
        wait_for("the HPA scaling up", scaled_up, c)
    finally:
        scaled.set()
    # ... and it scaled because requests waited: the average it saw was over its target of 1 (in milli-units)
    waiting = seen[-1]["currentMetrics"][0]["pods"]["current"]["averageValue"]
    assert int(waiting.removesuffix("m")) > 1000, seen[-1]
    for t in load:
        t.join(timeout=130)
    wait_for("the HPA scaling back to 1", lambda: replicas(store) == 1, c)


def replicas(store: Any) -> int:
    return int(store.get(DEPLOYMENTS, "default", "interlude-vllm")["spec"]["replicas"])


def test_a_deleted_pod_keeps_serving_through_its_prestop_pause_after_leaving_the_service(
    cluster: tuple[Any, Any, str],
) -> None:
    """The rendered containers' preStop sleep: once the pod has left the Service's endpoints it still answers,
    so a connection the Service routed to it just before is served, not refused (a drain loses no request)."""
    lc, c, uri = cluster
    store = c.kube.store
    wait_for("one ready pod", lambda: len(ready_pods(store)) == 1, c)
    pod = ready_pods(store)[0]
    uid = pod["metadata"]["uid"]
    pod_port = c.runtime.runners[uid].port
    proxy = next(iter(c.runtime.proxies.values()))
    # The Service's endpoints follow Ready a moment later (the runtime's next reconcile): wait, as service_answer does.
    wait_for("the pod in the Service's endpoints", lambda: pod_port in proxy.backends, c, timeout=30)
    requests.get(f"http://127.0.0.1:{pod_port}/health", timeout=10).raise_for_status()
    store.delete(PODS, "default", pod["metadata"]["name"])
    wait_for("the pod gone from the Service", lambda: pod_port not in proxy.backends, c, timeout=30)
    # The pod's own port, right after it left the Service: still listening (SIGTERM comes after the pause).
    requests.get(f"http://127.0.0.1:{pod_port}/health", timeout=10).raise_for_status()
