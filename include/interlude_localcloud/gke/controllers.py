"""Scheduler, cluster autoscaler and node maintenance of one cluster: the pure policies (policy/) applied
to the store. Called by runtime.py once per pass with the scenario-scaled clock.

- Scheduler: binds pending pods (as `pods/binding` does) to the node `scheduling.pick_node` picks, ranking
  nodes by the pod's ComputeClass priority; unschedulable pods get `PodScheduled=False` with
  kube-scheduler's message.
- Autoscaler: `autoscaler.plan` over pools, nodes, pods, ComputeClasses and the zone stockouts (admin);
  ScaleUp creates nodes (NotReady until the scenario's `gke_resize` delay passes) with nodes.node_object,
  the code the Container API's setSize uses; Migrate evicts (and cordons); ScaleDown deletes empty nodes.
- Maintenance (https://cloud.google.com/kubernetes-engine/docs/concepts/maintenance-windows-and-exclusions,
  https://cloud.google.com/kubernetes-engine/docs/how-to/handle-disruption-gpu-tpu): `maintenance.maintenance_status`
  puts `cloud.google.com/scheduled-maintenance-time` on the node at the notice, evicts at the window
  (or early once `cloud.google.com/perform-maintenance=true` is set), takes the node down, back or replaced;
  spot nodes are preempted with `maintenance.preemption_status`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from interlude_localcloud.gke import eviction
from interlude_localcloud.gke import nodes as node_objects
from interlude_localcloud.gke.policy import autoscaler, maintenance, scheduling
from interlude_localcloud.gke.policy.compute_class import ComputeClass
from interlude_localcloud.gke.policy.manifests import pod_from_manifest
from interlude_localcloud.gke.policy.model import (
    LABEL_INSTANCE_TYPE,
    LABEL_SPOT,
    CapacityEntry,
    Node,
    NodePool,
    PodView,
    ZoneCapacity,
)
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store
from interlude_localcloud.gke.store import now as store_now
from interlude_localcloud.gke.views import node_view, pool_view, quantities

PODS = next(r for r in RESOURCES if r.plural == "pods")
NODES = next(r for r in RESOURCES if r.plural == "nodes")
CLASSES = next(r for r in RESOURCES if r.plural == "computeclasses")
EVENTS = next(r for r in RESOURCES if r.plural == "events")
EVENTS_KEPT = 500


@dataclass
class ControlState:
    """What the controllers remember between passes (times are scenario-scaled seconds)."""

    autoscaler: autoscaler.AutoscalerState = field(default_factory=autoscaler.AutoscalerState)
    node_born: dict[str, float] = field(default_factory=dict)
    ready_at: dict[str, float] = field(default_factory=dict)  # real monotonic time a new node turns Ready
    stockouts: set[tuple[str, str]] = field(default_factory=set)  # (zone, machine_type)
    notices: dict[str, maintenance.MaintenanceNotice] = field(default_factory=dict)
    perform_seen: dict[str, float] = field(default_factory=dict)
    preempt_at: dict[str, float] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    def event(self, t: float, kind: str, **detail: Any) -> None:
        """``t``: scenario time; ``at``: the wall clock (epoch seconds), the clock of the cloud's own event and
        request logs, so an autoscaler decision can be ordered against a Container API call."""
        if any(
            e["kind"] == kind and {k: v for k, v in e.items() if k not in ("t", "at")} == {"kind": kind, **detail}
            for e in self.events[-20:]
        ):
            return  # the same news again (a pod still pending): once is enough
        self.events.append({"t": t, "at": time.time(), "kind": kind, **detail})
        del self.events[:-EVENTS_KEPT]


# GKE TPU accelerator label -> the TPU API's type prefix and accelerator units (cores for v4/v5p) per chip
# (https://cloud.google.com/tpu/docs/v6e, https://cloud.google.com/tpu/docs/v5p).
TPU_CAPACITY_TYPES = {
    "tpu-v6e-slice": ("v6e", 1),
    "tpu-v5-lite-podslice": ("v5litepod", 1),
    "tpu-v5p-slice": ("v5p", 2),
    "tpu-v4-podslice": ("v4", 2),
}
CapacityFn = Callable[[str, str, bool, str], int]  # (zone, cap_type, spot, kind) -> units still free


def capacity_key(pool: NodePool) -> tuple[str, str, int] | None:
    """(cloud kind tpu|gce, the scenario's capacity type, units one node holds) of a pool's accelerator."""
    if pool.tpu is not None and pool.tpu.type in TPU_CAPACITY_TYPES:
        prefix, per_chip = TPU_CAPACITY_TYPES[pool.tpu.type]
        return "tpu", f"{prefix}-{pool.tpu.chips * per_chip}", 1
    if pool.gpu is not None:
        return "gce", pool.gpu.type, pool.gpu.count  # GPUs are Compute Engine capacity
    return None


class Controllers:
    def __init__(
        self, cluster: Any, resize_delay: float, free_units: CapacityFn | None = None, tpu_fallback_wait: float = 0.0
    ) -> None:
        self.c = cluster  # clusters.ClusterState
        self.store: Store = cluster.kube.store
        self.resize_delay = resize_delay  # real seconds
        self.tpu_fallback_wait = tpu_fallback_wait  # scenario seconds (autoscaler.plan)
        self.free_units = free_units  # the zones' capacity left by TPU VMs and Compute instances
        self.state = ControlState()

    def capacity(self, pools: list[NodePool], nodes: list[Node]) -> ZoneCapacity:
        """Stockouts (admin) plus the scenario's zone capacity, less what this cluster's nodes hold."""
        entries = {(z, mt): CapacityEntry(z, mt, None, True) for z, mt in self.state.stockouts}
        for pool in pools:
            key = capacity_key(pool)
            if key is None or self.free_units is None or (pool.zone, pool.machine_type) in entries:
                continue
            kind, cap_type, units = key
            same = [
                n
                for n in nodes
                if n.zone == pool.zone
                and n.labels.get(LABEL_INSTANCE_TYPE) == pool.machine_type
                and (n.labels.get(LABEL_SPOT) == "true") == pool.spot
            ]
            free = self.free_units(pool.zone, cap_type, pool.spot, kind) - units * len(same)
            entries[(pool.zone, pool.machine_type)] = CapacityEntry(
                pool.zone, pool.machine_type, max(free // max(units, 1), 0)
            )
        return ZoneCapacity.of(entries.values())

    # ------------------------------------------------------------------ views
    def pools(self, autoscaled_only: bool = False) -> list[NodePool]:
        out = []
        for ps in self.c.pools.values():
            if ps.status in ("RUNNING", "RECONCILING") and (ps.spec.autoscaling or not autoscaled_only):
                template = node_objects.node_object(self.c.spec.name, ps.spec, 0, self.c.spec.kubernetes_version)
                out.append(pool_view(ps.spec, quantities(template["status"]["allocatable"])))
        return out

    def nodes(self) -> list[Node]:
        raw, _ = self.store.list(NODES, None)
        return [node_view(n, self.state.node_born.get(n["metadata"]["name"], 0.0)) for n in raw]

    def pods(self) -> list[tuple[dict[str, Any], PodView]]:
        raw, _ = self.store.list(PODS, None)
        return [
            (p, pod_from_manifest(p))
            for p in raw
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def classes(self) -> dict[str, ComputeClass]:
        raw, _ = self.store.list(CLASSES, None)
        out = {}
        for cc in raw:
            try:
                out[cc["metadata"]["name"]] = ComputeClass.from_manifest(cc)
            except (ValueError, KeyError):
                continue
        return out

    # ------------------------------------------------------------------ scheduler
    def schedule(self, now: float) -> None:
        pods = self.pods()
        nodes, pools, classes = self.nodes(), self.pools(), self.classes()
        used = scheduling.usage_by_node(v for _, v in pods)
        pending = sorted(
            ((p, v) for p, v in pods if v.node_name is None),
            key=lambda pv: (pv[0]["metadata"].get("creationTimestamp", ""), pv[1].name),
        )
        for pod, view in pending:
            placement = scheduling.pick_node(view, nodes, used, autoscaler.class_rank(classes, pools, view))
            if placement.node is None:
                self._unschedulable(pod, placement.message)
                continue
            scheduling.add_usage(used.setdefault(placement.node, {}), view)
            self._bind(pod, placement.node)
            self.state.event(now, "Scheduled", pod=view.name, node=placement.node)

    def _bind(self, pod: dict[str, Any], node: str) -> None:
        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            cur["spec"]["nodeName"] = node
            cur["metadata"].pop("resourceVersion", None)
            return cur

        try:
            self.store.update(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], mutate, "binding")
        except KubeError:
            pass

    def _unschedulable(self, pod: dict[str, Any], message: str) -> None:
        cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        conditions = (pod.get("status") or {}).get("conditions") or []
        prev = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
        if len(conditions) == 1 and {k: v for k, v in prev.items() if k != "lastTransitionTime"} == cond:
            return
        # kube-scheduler keeps lastTransitionTime while the pod stays unschedulable (the message may change)
        held = prev.get("status") == "False" and prev.get("lastTransitionTime")
        cond["lastTransitionTime"] = held or store_now()

        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            cur["status"] = {"phase": "Pending", "conditions": [cond]}
            cur["metadata"].pop("resourceVersion", None)
            return cur

        try:
            self.store.update(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], mutate, "status")
        except KubeError:
            pass

    # ------------------------------------------------------------------ autoscaler
    def autoscale(self, now: float) -> None:
        self._nodes_come_up()
        pods = self.pods()
        pools = self.pools(autoscaled_only=True)
        names = {p.name for p in pools}
        nodes = self.nodes()
        view = autoscaler.ClusterView(
            pools,
            [n for n in nodes if n.pool in names],
            [v for _, v in pods],
            self.classes(),
            self.capacity(pools, nodes),
        )
        plan = autoscaler.plan(view, self.state.autoscaler, now, tpu_fallback_wait=self.tpu_fallback_wait)
        self.state.autoscaler = plan.state
        by_name = {v.name: p for p, v in pods}
        for action in plan.actions:
            if isinstance(action, autoscaler.PodScaleUpNote):
                if action.pod in by_name:
                    self.pod_event(by_name[action.pod], action.reason, action.message)
                continue
            self.state.event(now, type(action).__name__, **{k: v for k, v in vars(action).items()})
            if isinstance(action, autoscaler.ScaleUp):
                for _ in range(action.count):
                    self._add_node(action.pool, now)
            elif isinstance(action, autoscaler.Migrate):
                if action.cordon_source:
                    self.cordon(action.from_node)
                if action.pod in by_name:
                    self.evict_within_budget(by_name[action.pod], now)
            elif isinstance(action, autoscaler.ScaleDown):
                self.remove_node(action.node)

    def _add_node(self, pool_name: str, now: float) -> None:
        ps = self.c.pools.get(pool_name)
        if ps is None:
            return
        taken = {n.name for n in self.nodes()}
        index = next(i for i in range(10_000) if node_objects.node_name(self.c.spec.name, pool_name, i) not in taken)
        obj = node_objects.node_object(self.c.spec.name, ps.spec, index, self.c.spec.kubernetes_version)
        obj["status"]["conditions"] = [
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "node is starting"}
        ]
        self.store.create(NODES, "", obj)
        ps.size += 1
        self.state.node_born[obj["metadata"]["name"]] = now
        self.state.ready_at[obj["metadata"]["name"]] = time.monotonic() + self.resize_delay

    def pod_event(self, pod: dict[str, Any], reason: str, message: str) -> None:
        """A core/v1 Event about the pod from the cluster autoscaler; a repeat bumps count and lastTimestamp."""
        meta = pod["metadata"]
        ns, name = meta["namespace"], f"{meta['name']}.{reason.lower()}"
        stamp = store_now()
        if self.store.exists(EVENTS, ns, name):

            def mutate(cur: dict[str, Any]) -> dict[str, Any]:
                cur.update(message=message, lastTimestamp=stamp, count=int(cur.get("count") or 1) + 1)
                cur["metadata"].pop("resourceVersion", None)
                return cur

            try:
                self.store.update(EVENTS, ns, name, mutate)
            except KubeError:
                pass
            return
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": meta["name"], "uid": meta.get("uid")},
            "reason": reason,
            "message": message,
            "type": "Normal" if reason == "TriggeredScaleUp" else "Warning",
            "source": {"component": "cluster-autoscaler"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self.store.create(EVENTS, ns, event)
        except KubeError:
            pass

    def next_ready_in(self) -> float | None:
        """Real seconds until the next new node turns Ready (the runtime wakes then, not a tick later)."""
        return max(min(self.state.ready_at.values()) - time.monotonic(), 0.0) if self.state.ready_at else None

    def _nodes_come_up(self) -> None:
        for name, at in list(self.state.ready_at.items()):
            if time.monotonic() >= at:
                self.state.ready_at.pop(name)
                self.set_ready(name, True)

    def set_ready(self, name: str, ready: bool) -> None:
        cond = (
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
            if ready
            else {
                "type": "Ready",
                "status": "False",
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
            }
        )
        self._update_node(name, lambda n: n["status"].__setitem__("conditions", [cond]), "status")

    def cordon(self, name: str) -> None:
        self._update_node(name, lambda n: n["spec"].__setitem__("unschedulable", True))

    def _update_node(self, name: str, change: Any, sub: str = "") -> None:
        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            change(cur)
            cur["metadata"].pop("resourceVersion", None)
            return cur

        try:
            self.store.update(NODES, "", name, mutate, sub)
        except KubeError:
            pass

    def evict(self, pod: dict[str, Any]) -> None:
        try:
            self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except KubeError:
            pass

    def evict_within_budget(self, pod: dict[str, Any], now: float) -> None:
        """A voluntary eviction (active migration) goes through the Eviction API's checks: a PodDisruptionBudget
        with no disruption to spare keeps the pod (retried at the next pass), as GKE's autoscaler respects PDBs
        (https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-autoscaler#scheduling-and-disruption)."""
        meta = pod["metadata"]
        try:
            eviction.evict(self.store, meta["namespace"], meta["name"], {"kind": "Eviction"})
        except KubeError as e:
            if e.code == 429:
                self.state.event(now, "EvictionBlocked", pod=meta["name"], reason=e.message)

    def remove_node(self, name: str) -> None:
        """The VM is gone: its pods are deleted (pod GC) and the pool shrinks."""
        for pod, view in self.pods():
            if view.node_name == name:
                self.evict(pod)
        try:
            node = self.store.delete(NODES, "", name)
        except KubeError:
            return
        ps = self.c.pools.get(node["metadata"]["labels"].get(node_objects.POOL_LABEL, ""))
        if ps is not None:
            ps.size = max(ps.size - 1, 0)
        for table in (self.state.notices, self.state.perform_seen, self.state.preempt_at, self.state.ready_at):
            table.pop(name, None)

    # ------------------------------------------------------------------ maintenance
    def maintain(self, now: float) -> None:
        for node in self.nodes():
            if node.name in self.state.preempt_at:
                status = maintenance.preemption_status(node, self.state.preempt_at[node.name], now)
            elif node.name in self.state.notices:
                if node.labels.get(maintenance.LABEL_PERFORM) == "true":
                    self.state.perform_seen.setdefault(node.name, now)
                status = maintenance.maintenance_status(
                    node, self.state.notices[node.name], now, self.state.perform_seen.get(node.name)
                )
            else:
                continue
            self._apply(node, status, now)

    def _apply(self, node: Node, st: maintenance.NodeMaintenance, now: float) -> None:
        labels, taints = dict(st.labels), [{"key": t.key, "value": t.value, "effect": t.effect} for t in st.taints]
        if labels != dict(node.labels) or tuple(st.taints) != tuple(node.taints):

            def change(n: dict[str, Any]) -> None:
                n["metadata"]["labels"] = labels
                n["spec"]["taints"] = taints

            self._update_node(node.name, change)
            self.state.event(now, "NodeMaintenance", node=node.name, phase=st.phase, reason=st.reason)
        if st.evict_pods:
            for pod, view in self.pods():
                if view.node_name == node.name:
                    self.evict(pod)
                    self.state.event(now, "Evicted", pod=view.name, node=node.name, reason=st.reason)
        if st.ready != node.ready and node.name not in self.state.ready_at:
            self.set_ready(node.name, st.ready)
        if st.delete_node:
            self.remove_node(node.name)
        elif st.phase == "done":
            self.state.notices.pop(node.name, None)
            self.state.perform_seen.pop(node.name, None)
