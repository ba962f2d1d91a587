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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from interlude import naming
from interlude.stage.jobset import API_VERSION, shape_for, short_name
from interlude.stage.jobset import render_jobset as render

log = logging.getLogger(__name__)

KIND = "gke_jobset"  # the machine record's kind for a run on GKE
NAMESPACE = "default"
JOBSET = {"group": "jobset.x-k8s.io", "version": API_VERSION.split("/")[1], "plural": "jobsets"}
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
OPERATION_TIMEOUT = 1800.0  # a node pool create/delete that takes longer than this fails the task, saying so


def chosen(spec: Any) -> bool:
    """The run trains on GKE: ``platforms`` names it first (the platforms decision's seam; see the README)."""
    return bool(spec.platforms) and spec.platforms[0] == "gke"


def pool_name(run_key: str) -> str:
    return short_name(run_key)


def decision(spec: Any) -> dict[str, Any]:
    """The GKE leaf: the first of the run's TPU types GKE runs here, in the run's first zone (checked by the spec)."""
    types = list(spec.tpu_types) or [c.accelerator_type for c in spec.profile().tpu_candidates]
    tpu_type = next(t for t in types if _has_shape(t))
    return {
        "leaf": "tpu",
        "kind": "tpu",
        "platform": "gke",
        "accelerator_type": tpu_type,
        "zone": spec.zones[0],
        "mode": "on_demand",
        "cluster": spec.gke_cluster,
        "location": spec.gke_location,
        "trail": [f"platforms: gke first; {tpu_type} as a {shape_for(tpu_type).machine_type} node pool"],
    }


def _has_shape(tpu_type: str) -> bool:
    try:
        shape_for(tpu_type)
        return True
    except ValueError:
        return False


def machine_record(spec: Any, decided: dict[str, Any]) -> dict[str, Any]:
    name = short_name(spec.run_key)
    return {
        "kind": KIND,
        "platform": "gke",
        "name": name,
        "zone": decided["zone"],
        "accelerator_type": decided["accelerator_type"],
        "mode": "on_demand",
        "runtime": spec.gke_image,
        "cluster": spec.gke_cluster,
        "location": spec.gke_location,
        "namespace": NAMESPACE,
        "node_pool": pool_name(spec.run_key),
        "jobset": name,
    }


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

    h = hook(gcp_conn_id, machine["location"])
    parent = _parent(h, machine["cluster"], machine["location"])
    shape = shape_for(machine["accelerator_type"])
    pool = machine["node_pool"]
    if not _pool_exists(h, parent, pool):
        body = {
            "name": pool,
            "initial_node_count": 1,
            "locations": [machine["zone"]],
            "config": {"machine_type": shape.machine_type, "labels": naming.labels(spec.run_key, spec.dag_id)},
            "placement_policy": {"tpu_topology": shape.topology},
        }
        log.info("Creating node pool %s (%s, %s) in %s", pool, shape.machine_type, shape.topology, parent)
        op = h.get_cluster_manager_client().create_node_pool(parent=parent, node_pool=body)
        _wait(h, machine["location"], op, spec.poll_seconds, f"node pool {pool}")
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
    from google.api_core.exceptions import NotFound

    pool = pool_name(spec.run_key)
    try:
        parent = _parent(h, spec.gke_cluster, spec.gke_location)
        if _pool_exists(h, parent, pool):
            op = h.get_cluster_manager_client().delete_node_pool(name=f"{parent}/nodePools/{pool}")
            _wait(h, spec.gke_location, op, max(spec.poll_seconds, 0.2), f"delete of node pool {pool}")
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


def capacity(spec: Any, gcp_conn_id: str) -> dict[str, Any]:
    """The cluster's node pools as GKE lists them (the run adds its own), for the choose step's log and XCom."""
    h = hook(gcp_conn_id, spec.gke_location)
    pools = h.get_cluster_manager_client().list_node_pools(parent=_parent(h, spec.gke_cluster, spec.gke_location))
    return {
        "platform": "gke",
        "cluster": spec.gke_cluster,
        "location": spec.gke_location,
        "node_pools": [
            {"name": p.name, "machine_type": p.config.machine_type, "locations": list(p.locations)}
            for p in pools.node_pools
        ],
    }
