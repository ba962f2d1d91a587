"""GKE clusters of the scenario at run time: node pools, their sizes, operations, and each cluster's
Kubernetes API server (started with the local cloud, stopped with it).

Node pool create/delete/resize return an Operation that is RUNNING until the scenario's delay passes,
then DONE, as GKE's long-running operations do
(https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.operations).

A create whose zone x machine type is stocked out (the admin's GKE stockouts, what the autoscaler honours) ends
as on Google: the operation DONE with the managed instance group's error ("[GCE_STOCKOUT] ... does not have
enough resources available to fulfill the request"), the pool left in ERROR with no node, waiting for capacity
until someone deletes it (https://cloud.google.com/kubernetes-engine/docs/troubleshooting/node-pools).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from interlude_localcloud.cloud import Cloud, rfc3339
from interlude_localcloud.errors import ApiError, already_exists, invalid, not_found
from interlude_localcloud.gke import defaults, nodes
from interlude_localcloud.gke.config import EFFECTS, ClusterSpec, GpuSpec, NodePoolSpec, Taint, TpuSpec
from interlude_localcloud.gke.control_loop import ControlLoop
from interlude_localcloud.gke.controllers import NODES, capacity_key
from interlude_localcloud.gke.deployments import DeploymentController
from interlude_localcloud.gke.endpoints import endpoints_controller
from interlude_localcloud.gke.garbage_collector import garbage_collector
from interlude_localcloud.gke.jobs import JobController
from interlude_localcloud.gke.jobset_controller import JobSetController
from interlude_localcloud.gke.nodes import POOL_LABEL
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.runtime import ClusterRuntime
from interlude_localcloud.gke.views import pool_view

if TYPE_CHECKING:  # uvicorn, FastAPI and the Kubernetes API's models: imported only for a scenario with clusters
    from interlude_localcloud.gke.kube_server import KubeApiServer

# TPU machine types -> the accelerator label GKE puts on their nodes
# (https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus#availability).
TPU_MACHINE_PREFIXES = {
    "ct4p": "tpu-v4-podslice",
    "ct5lp": "tpu-v5-lite-podslice",
    "ct5p": "tpu-v5p-slice",
    "ct6e": "tpu-v6e-slice",
    "tpu7x": "tpu7x",
}
NAMESPACES = RESOURCES[0]
_EFFECT_BY_ENUM = {v: k for k, v in EFFECTS.items()}
DEFAULT_TOPOLOGY = {1: "1x1", 4: "2x2", 8: "2x4"}


@dataclass
class PoolState:
    spec: NodePoolSpec
    size: int
    created: str
    status: str = "RUNNING"
    status_message: str = ""


@dataclass
class ClusterState:
    spec: ClusterSpec
    project: str
    kube: KubeApiServer
    created: str
    id: str
    pools: dict[str, PoolState] = field(default_factory=dict)
    controller: DeploymentController | None = None
    runtime: ClusterRuntime | None = None
    # the garbage collector, the Endpoints/EndpointSlice, Job and JobSet controllers
    loops: list[ControlLoop] = field(default_factory=list)


def tpu_from_machine_type(machine_type: str, topology: str | None) -> TpuSpec | None:
    prefix = machine_type.split("-")[0]
    accel = TPU_MACHINE_PREFIXES.get(prefix)
    if accel is None:
        return None
    m = re.search(r"-(\d+)t$", machine_type)
    chips = int(m.group(1)) if m else 4
    return TpuSpec(accel, topology or DEFAULT_TOPOLOGY.get(chips, f"{chips}x1"), chips)


def pool_from_request(body: dict[str, Any], location: str) -> NodePoolSpec:
    """A NodePool resource (CreateNodePoolRequest.nodePool) -> NodePoolSpec."""
    name = body.get("name") or ""
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", name):
        raise invalid(f'Invalid node pool name "{name}".')
    config = body.get("config") or {}
    machine_type = config.get("machineType") or "e2-medium"
    accels = config.get("accelerators") or []
    gpu = GpuSpec(accels[0]["acceleratorType"], int(accels[0].get("acceleratorCount", 1))) if accels else None
    tpu = tpu_from_machine_type(machine_type, (body.get("placementPolicy") or {}).get("tpuTopology"))
    autoscaling = body.get("autoscaling") or {}
    initial = int(body.get("initialNodeCount", 0))
    zones = list(body.get("locations") or ([location] if location.count("-") == 2 else [f"{location}-a"]))
    return NodePoolSpec(
        name=name,
        machine_type=machine_type,
        min_nodes=int(autoscaling.get("minNodeCount", 0)),
        max_nodes=int(autoscaling.get("maxNodeCount", max(initial, 1))),
        initial_nodes=initial,
        spot=bool(config.get("spot") or config.get("preemptible")),
        zones=zones,
        tpu=tpu,
        gpu=gpu,
        labels=dict(config.get("labels") or {}),
        metadata={str(k): str(v) for k, v in (config.get("metadata") or {}).items()},
        autoscaling=bool(autoscaling.get("enabled")),
        taints=[
            Taint(t.get("key", ""), t.get("value", ""), _EFFECT_BY_ENUM.get(t.get("effect", ""), "NoSchedule"))
            for t in config.get("taints") or []
        ],
    )


def stockout_message(c: ClusterState, spec: NodePoolSpec, zones: list[str]) -> str:
    """The managed instance group's error GKE's create operation ends with in a stockout (Google's words)."""
    instance = f"gke-{c.spec.name}-{spec.name}-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:4]}"
    where = " ".join(
        f"The zone 'projects/{c.project}/zones/{z}' does not have enough resources available to fulfill the request."
        for z in zones
    )
    return (
        "Google Compute Engine: Not all instances running in IGM after 60s. Expected 1, running 0, transitioning 1. "
        f"Current errors: [GCE_STOCKOUT]: Instance '{instance}' creation failed: {where} "
        "'(resource type:compute)'."
    )


class Gke:
    """All clusters of one local cloud, plus the Container API's operations."""

    def __init__(self, cloud: Cloud, specs: list[ClusterSpec], state_dir: Path) -> None:
        self.cloud = cloud
        self.clusters: dict[tuple[str, str], ClusterState] = {}
        self.state_dir = state_dir
        self.operations: dict[tuple[str, str], dict[str, Any]] = {}  # (location, name) -> Operation
        if specs:  # ~0.6 CPU-s of imports that a cloud without clusters (most test runs) never needs
            from interlude_localcloud.gke.kube_server import KubeApiServer
        for spec in specs:
            kube = KubeApiServer(spec, state_dir)
            self.clusters[(spec.location, spec.name)] = ClusterState(
                spec, cloud.scenario.project, kube, rfc3339(), cloud.new_id()
            )

    def start(self) -> None:
        from interlude_localcloud.gke.node_vms import GkeNodeVms

        self.cloud.node_units = self.node_units
        self.cloud.gke_nodes = GkeNodeVms(self)
        for c in self.clusters.values():
            c.kube.start()
            for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
                obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                defaults.apply(NAMESPACES, obj)
                c.kube.store.create(NAMESPACES, "", obj)
            for p in c.spec.node_pools:
                c.pools[p.name] = PoolState(p, p.initial_nodes, c.created)
                nodes.sync_pool(c.kube.store, c.spec.name, p, p.initial_nodes, c.spec.kubernetes_version)
            c.controller = DeploymentController(c.kube.store)
            c.controller.start()
            store = c.kube.store
            c.loops = [
                garbage_collector(store),
                endpoints_controller(store),
                JobController(store),
                JobSetController(store),
            ]
            for loop in c.loops:
                loop.start()
            if not c.spec.run:
                continue
            sc = self.cloud.scenario
            env = {"GOOGLE_CLOUD_PROJECT": c.project}
            gcs = getattr(self.cloud, "gcs_endpoint", None) or os.environ.get("STORAGE_EMULATOR_HOST")
            if gcs:
                env["STORAGE_EMULATOR_HOST"] = str(gcs)
            c.runtime = ClusterRuntime(
                c,
                self.state_dir,
                sc.time_scale,
                sc.delay("gke_resize"),
                env,
                self._free_units,
                sc.delays.get("gke_tpu_fallback_wait", 0.0),  # scenario seconds, as the autoscaler's clock
            )
            c.runtime.start()

    def _free_units(self, zone: str, cap_type: str, spot: bool, kind: str) -> int:
        """The zone's TPU/GPU capacity (scenario) left by TPU VMs and Compute instances: one engine for all.
        (The autoscaler subtracts its own cluster's nodes itself.)"""
        with self.cloud.lock:
            held = self.cloud.machine_units(zone, cap_type, spot, kind)
            return self.cloud.capacity(zone, cap_type, spot, kind) - held

    def node_units(self, zone: str, cap_type: str, spot: bool, kind: str) -> int:
        """Accelerator units every cluster's nodes hold in a zone: what a TPU or Compute create must leave."""
        total = 0
        for c in self.clusters.values():
            pools = {name: pool_view(ps.spec, {}) for name, ps in list(c.pools.items())}
            for node in c.kube.store.list(NODES, None)[0]:
                labels = node["metadata"].get("labels") or {}
                pool = pools.get(labels.get(POOL_LABEL, ""))
                key = capacity_key(pool) if pool is not None else None
                if key is None or pool is None or pool.zone != zone or pool.spot != spot:
                    continue
                if key[0] == kind and key[1] == cap_type:
                    total += key[2]
        return total

    def stop(self) -> None:
        for c in self.clusters.values():
            if c.runtime is not None:
                c.runtime.stop()
            if c.controller is not None:
                c.controller.stop()
            for loop in c.loops:
                loop.stop()
            c.kube.stop()

    # lookups ----------------------------------------------------------------------------------
    def cluster(self, project: str, location: str, name: str) -> ClusterState:
        c = self.clusters.get((location, name))
        if c is None or c.project != project:
            raise not_found(f"projects/{project}/locations/{location}/clusters/{name}")
        return c

    def pool(self, c: ClusterState, name: str) -> PoolState:
        p = c.pools.get(name)
        if p is None:
            raise not_found(f"projects/{c.project}/locations/{c.spec.location}/clusters/{c.spec.name}/nodePools/{name}")
        return p

    # operations -------------------------------------------------------------------------------
    def _operation(
        self, c: ClusterState, op_type: str, target: str, delay: float, finish: Callable[[], str | None]
    ) -> dict[str, Any]:
        name = f"operation-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
        loc = c.spec.location
        base = f"https://container.googleapis.com/v1/projects/{c.project}/locations/{loc}"
        op: dict[str, Any] = {
            "name": name,
            "zone": loc,
            "location": loc,
            "operationType": op_type,
            "status": "RUNNING",
            "selfLink": f"{base}/operations/{name}",
            "targetLink": f"{base}/clusters/{c.spec.name}/{target}",
            "startTime": rfc3339(),
        }
        self.operations[(loc, name)] = op

        def done() -> None:
            error = finish()
            op.update(status="DONE", endTime=rfc3339())
            if error:  # google.rpc.Status: code 8 RESOURCE_EXHAUSTED
                op.update(error={"code": 8, "message": error}, statusMessage=error)
            self.cloud.log("gke_operation_done", operation=name, type=op_type, target=target, error=error)

        self.cloud.after(delay, done)
        return op

    def get_operation(self, project: str, location: str, name: str) -> dict[str, Any]:
        op = self.operations.get((location, name))
        if op is None:
            raise not_found(f"projects/{project}/locations/{location}/operations/{name}")
        return op

    @staticmethod
    def _stocked_out(c: ClusterState, zone: str, machine_type: str) -> bool:
        """The admin's GKE stockout of this zone x machine type (the one the cluster autoscaler honours)."""
        # no runtime lock: the caller may hold the cloud's, which the runtime's pass takes under its own (one
        # membership test of a set is atomic)
        return c.runtime is not None and (zone, machine_type) in c.runtime.controllers.state.stockouts

    # node pool methods ------------------------------------------------------------------------
    def create_pool(self, c: ClusterState, body: dict[str, Any]) -> dict[str, Any]:
        spec = pool_from_request(body, c.spec.location)
        if spec.name in c.pools:
            raise already_exists(
                f"projects/{c.project}/locations/{c.spec.location}/clusters/{c.spec.name}/nodePools/{spec.name}"
            )
        state = PoolState(spec, spec.initial_nodes, rfc3339(), status="PROVISIONING")
        c.pools[spec.name] = state

        def finish() -> str | None:
            stocked = [z for z in spec.zones if self._stocked_out(c, z, spec.machine_type)]
            if stocked:
                state.size, state.status = 0, "ERROR"
                state.status_message = stockout_message(c, spec, stocked)
                return state.status_message
            state.status = "RUNNING"
            nodes.sync_pool(c.kube.store, c.spec.name, spec, state.size, c.spec.kubernetes_version)
            return None

        return self._operation(
            c, "CREATE_NODE_POOL", f"nodePools/{spec.name}", self.cloud.scenario.delay("gke_node_pool_create"), finish
        )

    def delete_pool(self, c: ClusterState, name: str) -> dict[str, Any]:
        state = self.pool(c, name)
        if state.status == "STOPPING":
            raise ApiError(400, f'Node pool "{name}" is being deleted.', "FAILED_PRECONDITION")
        state.status = "STOPPING"

        def finish() -> None:
            c.pools.pop(name, None)
            nodes.sync_pool(c.kube.store, c.spec.name, state.spec, 0, c.spec.kubernetes_version)
            return None

        return self._operation(
            c, "DELETE_NODE_POOL", f"nodePools/{name}", self.cloud.scenario.delay("gke_node_pool_delete"), finish
        )

    def set_size(self, c: ClusterState, name: str, count: int) -> dict[str, Any]:
        state = self.pool(c, name)
        if count < 0:
            raise invalid("node_count must be non-negative.")
        state.status = "RECONCILING"

        def finish() -> None:
            state.size = count
            state.status = "RUNNING"
            nodes.sync_pool(c.kube.store, c.spec.name, state.spec, count, c.spec.kubernetes_version)
            return None

        return self._operation(
            c, "SET_NODE_POOL_SIZE", f"nodePools/{name}", self.cloud.scenario.delay("gke_resize"), finish
        )
