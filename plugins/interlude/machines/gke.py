"""A run's place on GKE: the node pool it creates, the JobSet it trains in, and deleting both, always.

The GKE platform (``platforms`` first names ``gke``): the run creates one TPU node pool in the user's cluster
(``gke_cluster`` in ``gke_location``), named from the run key, and one JobSet on it (interlude.stage.jobset),
whose pod runs the workload's agent as a TPU VM would. Names are fixed by the run key (``il-<hash>``), so a
retry adopts what an earlier try made and teardown finds it without an intent record; the pool also carries
the node label ``interlude-run=<run_key>``.

The Google provider's GKE hooks reach the cluster (interlude.hooks.gke: ``GKEHook`` for the Container API,
its ``GKEKubernetesHook`` for the cluster's Kubernetes API); the provider has no node-pool methods, so those are
the Container API client's own (``create_node_pool``, ``delete_node_pool``, ``get_operation``), polled here at the
run's pace rather than the provider's fixed 15 s.
(https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters.nodePools)

A stockout: GKE's create operation ends with the managed instance group's error ("[GCE_STOCKOUT] ... does not
have enough resources available to fulfill the request", ZONE_RESOURCE_POOL_EXHAUSTED) and leaves the pool in
ERROR, still waiting for capacity (https://cloud.google.com/kubernetes-engine/docs/troubleshooting/node-pools,
"Node pool creation fails due to resource availability"). Interlude deletes that pool and raises StockoutError,
so the tree is walked again without the place (a GPU pool, for a portable model). A GPU pool is named
``il-<hash>-gpu``; teardown deletes every pool of the run (``il-<hash>`` and ``il-<hash>-*``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from interlude import naming
from interlude.stage.jobset import API_VERSION, gpu_shape_for, shape_for, short_name
from interlude.stage.jobset import render_jobset as render

log = logging.getLogger(__name__)

KIND = "gke_jobset"  # the machine record's kind for a run on GKE
NAMESPACE = "default"
JOBSET = {"group": "jobset.x-k8s.io", "version": API_VERSION.split("/")[1], "plural": "jobsets"}
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
OPERATION_TIMEOUT = 1800.0  # a node pool create/delete that takes longer than this fails the task, saying so
#: What GKE's node pool create operation says when the zone has no capacity for the pool's machines.
STOCKOUT_WORDS = ("GCE_STOCKOUT", "ZONE_RESOURCE_POOL_EXHAUSTED", "does not have enough resources available")


def chosen(spec: Any) -> bool:
    """The run may train on GKE (``platforms`` names it, with a cluster): the cluster is checked first, cleaned up
    last, and its node pools are a place the tree may choose."""
    return "gke" in (spec.platforms or ()) and bool(spec.gke_cluster)


def platforms(spec: Any) -> list[str]:
    """The run's platforms the tree may place it on: ``gke`` only with a cluster to create node pools in."""
    return [p for p in spec.platforms if p != "gke" or chosen(spec)]


def pool_name(run_key: str, accelerator_type: str | None = None) -> str:
    """``il-<hash>`` for a TPU pool, ``il-<hash>-gpu`` for a GPU pool (one run may have held both after a move)."""
    base = short_name(run_key)
    return f"{base}-gpu" if accelerator_type and accelerator_type.startswith("nvidia-") else base


def machine_record(spec: Any, decided: dict[str, Any]) -> dict[str, Any]:
    name = short_name(spec.run_key)
    accel = decided["accelerator_type"]
    record = {
        "kind": KIND,
        "platform": "gke",
        "name": name,
        "zone": decided["zone"],
        "accelerator_type": accel,
        "mode": "on_demand",
        "runtime": spec.gke_image,
        "cluster": spec.gke_cluster,
        "location": spec.gke_location,
        "namespace": NAMESPACE,
        "node_pool": pool_name(spec.run_key, accel),
        "jobset": name,
    }
    if accel.startswith("nvidia-"):
        gpu = gpu_shape_for(accel, int(decided.get("count") or 1), decided.get("machine_type"))
        record.update(gpu_count=gpu.count, machine_type=gpu.machine_type)
    return record


def hook(gcp_conn_id: str, location: str) -> Any:
    from interlude.hooks.gke import GKEHook

    return GKEHook(gcp_conn_id=gcp_conn_id, location=location)


def _parent(h: Any, cluster: str, location: str) -> str:
    return f"projects/{h.project_id}/locations/{location}/clusters/{cluster}"


def _wait(h: Any, location: str, op: Any, poll: float, what: str) -> None:
    """Poll a Container API operation until DONE; an error or OPERATION_TIMEOUT raises, naming it."""
    from google.cloud.container_v1 import Operation

    deadline = time.monotonic() + OPERATION_TIMEOUT
    client = h.get_cluster_manager_client()
    name = f"projects/{h.project_id}/locations/{location}/operations/{op.name}"
    while op.status != Operation.Status.DONE:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: operation {op.name} not done after {OPERATION_TIMEOUT:.0f}s")
        time.sleep(poll)
        op = client.get_operation(name=name)
    if op.error and op.error.message:
        if any(w in op.error.message for w in STOCKOUT_WORDS):
            from interlude.hooks.errors import StockoutError

            raise StockoutError(f"{what}: {op.error.message}", code=op.error.code, status="GCE_STOCKOUT")
        raise RuntimeError(f"{what}: {op.error.message}")


def _pool_exists(h: Any, parent: str, name: str) -> bool:
    from google.api_core.exceptions import NotFound

    try:
        h.get_cluster_manager_client().get_node_pool(name=f"{parent}/nodePools/{name}")
        return True
    except NotFound:
        return False


def provision(spec: Any, machine: dict[str, Any], gcp_conn_id: str) -> dict[str, Any]:
    """Create (or adopt) the run's node pool and JobSet; the machine record back. Idempotent."""
    from kubernetes import client as k8s

    from interlude.hooks.errors import StockoutError

    h = hook(gcp_conn_id, machine["location"])
    parent = _parent(h, machine["cluster"], machine["location"])
    pool = machine["node_pool"]
    if not _pool_exists(h, parent, pool):
        body = _pool_body(spec, machine, pool)
        log.info("Creating node pool %s (%s) in %s", pool, body["config"]["machine_type"], parent)
        op = h.get_cluster_manager_client().create_node_pool(parent=parent, node_pool=body)
        try:
            _wait(h, machine["location"], op, spec.poll_seconds, f"node pool {pool} in {machine['zone']}")
        except StockoutError:
            # GKE keeps an errored pool waiting for capacity: the run made it, the run deletes it now
            out = GkeTeardown()
            _delete_one_pool(spec, h, parent, pool, out)
            log.warning("Node pool %s stocked out; deleted it (%s)", pool, "; ".join(out.problems) or "gone")
            raise
    body = render(
        run_key=spec.run_key,
        dag_id=spec.dag_id,
        bucket=spec.bucket,
        tpu_type=machine["accelerator_type"],
        image=spec.gke_image,
        idle_poll=spec.poll_seconds,
        fresh_token=spec.fresh_token,
        node_pool=pool,
        namespace=machine["namespace"],
        gpu_count=int(machine.get("gpu_count") or 1),
        machine_type=machine.get("machine_type"),
    )
    with h.kubernetes_hook(machine["cluster"]).get_conn() as api:
        custom = k8s.CustomObjectsApi(api)
        try:
            custom.create_namespaced_custom_object(**JOBSET, namespace=machine["namespace"], body=body)
            log.info("JobSet %s created on node pool %s", machine["jobset"], pool)
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
            found = custom.get_namespaced_custom_object(
                **JOBSET, namespace=machine["namespace"], name=machine["jobset"]
            )
            if (found["metadata"].get("labels") or {}).get("interlude-run") != spec.run_key:
                raise RuntimeError(f"JobSet {machine['jobset']} exists and is not this run's") from exc
            log.info("JobSet %s exists (an earlier try made it): adopted", machine["jobset"])
    return machine


def _pool_body(spec: Any, machine: dict[str, Any], pool: str) -> dict[str, Any]:
    """The NodePool to create: one node of the TPU shape (its topology), or one GPU node with its accelerators.

    Autoscaled at one node: a node GKE loses (a host replaced, a preemption) is asked for again by the
    cluster autoscaler for the pending pod, and its failure ("scale.up.error.out.of.resources") shows on the pod
    (https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-autoscaler-visibility)."""
    accel = machine["accelerator_type"]
    # the Airflow run in the VMs' metadata, as on a VM: the sweeper asks Airflow for its state (machines.sweeper)
    meta = {naming.DAG_ID_METADATA: spec.dag_id, naming.RUN_ID_METADATA: spec.run_id}
    config: dict[str, Any] = {"labels": naming.labels(spec.run_key, spec.dag_id), "metadata": meta}
    body: dict[str, Any] = {
        "name": pool,
        "initial_node_count": 1,
        "locations": [machine["zone"]],
        "autoscaling": {"enabled": True, "min_node_count": 1, "max_node_count": 1},
        "config": config,
    }
    if accel.startswith("nvidia-"):
        gpu = gpu_shape_for(accel, int(machine.get("gpu_count") or 1), machine.get("machine_type"))
        config["machine_type"] = gpu.machine_type
        # https://cloud.google.com/kubernetes-engine/docs/how-to/gpus#create: accelerators on the node config
        config["accelerators"] = [{"accelerator_type": gpu.accelerator, "accelerator_count": gpu.count}]
    else:
        shape = shape_for(accel)
        config["machine_type"] = shape.machine_type
        body["placement_policy"] = {"tpu_topology": shape.topology}
    return body


def delete_jobset(
    spec: Any, machine: dict[str, Any], gcp_conn_id: str, wait: Callable[[float], None] = time.sleep
) -> None:
    """Delete the run's JobSet (foreground) and wait until it and its pods are gone: before a move, whose JobSet
    takes the same name on the new pool."""
    from kubernetes import client as k8s

    h = hook(gcp_conn_id, machine["location"])
    with h.kubernetes_hook(machine["cluster"]).get_conn() as api:
        custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
        try:
            custom.delete_namespaced_custom_object(
                **JOBSET,
                namespace=machine["namespace"],
                name=machine["jobset"],
                body=k8s.V1DeleteOptions(propagation_policy="Foreground"),
            )
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise
        deadline = time.monotonic() + 300
        while left := _jobset_left(custom, core, machine["jobset"]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(left)} still there 300s after the JobSet's delete")
            wait(max(spec.poll_seconds, 0.2))


def delete_pool(spec: Any, machine: dict[str, Any], gcp_conn_id: str) -> list[str]:
    """Delete one of the run's node pools (the one a move leaves); the problems, said (teardown tries again)."""
    h = hook(gcp_conn_id, machine["location"])
    out = GkeTeardown()
    _delete_one_pool(spec, h, _parent(h, machine["cluster"], machine["location"]), machine["node_pool"], out)
    return out.problems


@dataclass
class GkeTeardown:
    deleted: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def teardown(spec: Any, gcp_conn_id: str, wait: Callable[[float], None] = time.sleep) -> GkeTeardown:
    """Delete the run's JobSet (its Jobs and pods in the foreground) and the node pool it created; list again.

    Every step runs whatever the earlier ones did; anything not confirmed gone is a problem (the task fails)."""
    from kubernetes import client as k8s

    out = GkeTeardown()
    name = short_name(spec.run_key)
    h = hook(gcp_conn_id, spec.gke_location)
    try:
        with h.kubernetes_hook(spec.gke_cluster).get_conn() as api:
            custom, core = k8s.CustomObjectsApi(api), k8s.CoreV1Api(api)
            try:
                custom.delete_namespaced_custom_object(
                    **JOBSET, namespace=NAMESPACE, name=name, body=k8s.V1DeleteOptions(propagation_policy="Foreground")
                )
                out.deleted.append(f"jobsets/{name}")
            except k8s.ApiException as exc:
                if exc.status != 404:
                    out.problems.append(f"delete of JobSet {name} failed: {exc.status} {exc.reason}")
            deadline = time.monotonic() + 300
            left: list[str] = []
            while time.monotonic() < deadline:
                left = _jobset_left(custom, core, name)
                if not left:
                    break
                wait(max(spec.poll_seconds, 0.2))
            out.problems += [f"{what} is still there after the JobSet's delete" for what in left]
    except Exception as exc:  # noqa: BLE001 - the node pool is still deleted; the task fails below
        out.problems.append(f"the cluster's Kubernetes API: {type(exc).__name__}: {exc}")
    _delete_pool(spec, h, out)
    return out


def _jobset_left(custom: Any, core: Any, name: str) -> list[str]:
    from kubernetes import client as k8s

    left = [
        f"pods/{p.metadata.name}"
        for p in core.list_namespaced_pod(NAMESPACE, label_selector=f"{JOBSET_LABEL}={name}").items
    ]
    try:
        custom.get_namespaced_custom_object(**JOBSET, namespace=NAMESPACE, name=name)
        left.append(f"jobsets/{name}")
    except k8s.ApiException as exc:
        if exc.status != 404:
            raise
    return left


def _delete_pool(spec: Any, h: Any, out: GkeTeardown) -> None:
    """Every node pool of the run: ``il-<hash>`` and ``il-<hash>-*`` (a TPU pool, the GPU pool a move made)."""
    base = short_name(spec.run_key)
    try:
        parent = _parent(h, spec.gke_cluster, spec.gke_location)
        listed = h.get_cluster_manager_client().list_node_pools(parent=parent).node_pools
        pools = [p.name for p in listed if p.name == base or p.name.startswith(base + "-")]
    except Exception as exc:  # noqa: BLE001 - said, and the task fails
        out.problems.append(f"node pools of {spec.gke_cluster}: {type(exc).__name__}: {exc}")
        return
    for pool in pools:
        _delete_one_pool(spec, h, parent, pool, out)


def _delete_one_pool(spec: Any, h: Any, parent: str, pool: str, out: GkeTeardown) -> None:
    from google.api_core.exceptions import NotFound

    location = parent.split("/locations/", 1)[1].split("/", 1)[0]
    try:
        if _pool_exists(h, parent, pool):
            op = h.get_cluster_manager_client().delete_node_pool(name=f"{parent}/nodePools/{pool}")
            _wait(h, location, op, max(spec.poll_seconds, 0.2), f"delete of node pool {pool}")
            out.deleted.append(f"nodePools/{pool}")
        if _pool_exists(h, parent, pool):
            out.problems.append(f"node pool {pool} is still there after its delete")
    except NotFound:
        pass
    except Exception as exc:  # noqa: BLE001 - said, and the task fails
        out.problems.append(f"node pool {pool}: {type(exc).__name__}: {exc}")


def preflight(spec: Any, gcp_conn_id: str) -> None:
    """The cluster exists and answers (before anything is created); else a refusal naming gke_cluster."""
    from interlude.training.spec import RunSpecError

    try:
        hook(gcp_conn_id, spec.gke_location).get_cluster(name=spec.gke_cluster)
    except Exception as exc:
        raise RunSpecError(
            [f"gke_cluster: {spec.gke_cluster!r} in gke_location {spec.gke_location!r}: {type(exc).__name__}: {exc}"]
        ) from exc


def cluster_version(spec: Any, gcp_conn_id: str) -> tuple[str, bool]:
    """The cluster's GKE version (its control plane's; new node pools take it) and whether it is Autopilot."""
    cluster = hook(gcp_conn_id, spec.gke_location).get_cluster(name=spec.gke_cluster)
    return str(cluster.current_master_version), bool(cluster.autopilot.enabled)
