"""The kube-scheduler filters a GKE serving pod meets, and a deterministic choice among feasible nodes.

Filters (https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/ and
https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/): node readiness and
cordon, ``nodeSelector``, required node affinity (``requiredDuringSchedulingIgnoredDuringExecution``,
terms ORed, expressions ANDed - e.g. ``cloud.google.com/scheduled-maintenance-time DoesNotExist`` keeps
pods off nodes with maintenance coming), untolerated ``NoSchedule``/``NoExecute`` taints, and resource
fit (requests against allocatable minus what bound pods request), and required pod anti-affinity over
``kubernetes.io/hostname`` with ``matchLabels`` (a pod never joins a node holding a pod its term matches;
the existing pods' own terms are not checked against the newcomer). The failure message has the shape of
kube-scheduler's ``FailedScheduling`` event ("0/3 nodes are available: ...").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from interlude_localcloud.gke.policy.model import Node, PodView, Taint, anti_affinity_key

NodeRank = Callable[[Node], int]


@dataclass(frozen=True)
class Fit:
    node: str
    fits: bool
    reason: str = ""  # the FailedScheduling phrase for this node ("node(s) didn't match ...")


@dataclass(frozen=True)
class Placement:
    pod: str
    node: str | None
    message: str  # "" when placed, else the FailedScheduling message


def usage_by_node(pods: Iterable[PodView]) -> dict[str, dict[str, float]]:
    """Sum of requests of the pods bound to each node (plus one "pods" per pod)."""
    used: dict[str, dict[str, float]] = {}
    for pod in pods:
        if pod.node_name is None:
            continue
        add_usage(used.setdefault(pod.node_name, {}), pod)
    return used


def add_usage(totals: dict[str, float], pod: PodView) -> None:
    """The pod now takes room on the node whose usage `totals` is."""
    for key, amount in pod.usage().items():
        totals[key] = totals.get(key, 0.0) + amount


def untolerated_taint(pod: PodView, node: Node) -> Taint | None:
    tolerations = pod.effective_tolerations()
    for taint in node.taints:
        if taint.effect == "PreferNoSchedule":
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return taint
    return None


def matches_node_selection(pod: PodView, node: Node) -> bool:
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    return not pod.required_affinity or any(term.matches(node.labels) for term in pod.required_affinity)


def insufficient(pod: PodView, node: Node, used: Mapping[str, float]) -> list[str]:
    """Resources the node lacks for this pod (kube-scheduler's NodeResourcesFit)."""
    wanted = dict(pod.requests)
    wanted["pods"] = wanted.get("pods", 0.0) + 1.0
    short = []
    for resource, amount in sorted(wanted.items()):
        if amount <= 0:
            continue
        if used.get(resource, 0.0) + amount > node.allocatable.get(resource, 0.0) + 1e-9:
            short.append(resource)
    return short


def check(pod: PodView, node: Node, used: Mapping[str, float], assume_ready: bool = False) -> Fit:
    """Run the filters in kube-scheduler's order; the first that fails names the reason.

    ``assume_ready`` treats a NotReady node as ready: the autoscaler's view of a node still coming up.
    """
    if not (node.ready or assume_ready):
        return Fit(node.name, False, "node(s) were not ready")
    if node.unschedulable:
        return Fit(node.name, False, "node(s) were unschedulable")
    if not matches_node_selection(pod, node):
        return Fit(node.name, False, "node(s) didn't match Pod's node affinity/selector")
    taint = untolerated_taint(pod, node)
    if taint is not None:
        return Fit(node.name, False, f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}")
    if any(used.get(anti_affinity_key(term), 0.0) > 0 for term in pod.anti_affinity):
        return Fit(node.name, False, "node(s) didn't match pod anti-affinity rules")
    short = insufficient(pod, node, used)
    if short:
        return Fit(node.name, False, f"Insufficient {short[0]}")
    return Fit(node.name, True)


def failure_message(fits: Sequence[Fit]) -> str:
    """``0/N nodes are available: 2 node(s) had ..., 1 Insufficient cpu.`` (strings sorted, as kube-scheduler does)."""
    counts = Counter(f.reason for f in fits if not f.fits)
    parts = ", ".join(sorted(f"{n} {reason}" for reason, n in counts.items()))
    return f"0/{len(fits)} nodes are available: {parts}." if parts else f"0/{len(fits)} nodes are available."


def _free_share(node: Node, used: Mapping[str, float]) -> float:
    """LeastAllocated-style score: mean free fraction of cpu and memory (1.0 when unknown)."""
    shares = []
    for resource in ("cpu", "memory"):
        total = node.allocatable.get(resource, 0.0)
        if total > 0:
            shares.append((total - used.get(resource, 0.0)) / total)
    return sum(shares) / len(shares) if shares else 1.0


def pick_node(
    pod: PodView,
    nodes: Sequence[Node],
    used: Mapping[str, Mapping[str, float]],
    rank: NodeRank | None = None,
) -> Placement:
    """The node this pod binds to, or the FailedScheduling message.

    Deterministic: lowest ``rank`` first (the controller passes the ComputeClass priority of the node's
    pool, the preference GKE applies when a class has several kinds of nodes), then most free share, then
    name. Real kube-scheduler breaks ties at random; tests need a fixed answer.
    """
    fits = [check(pod, node, used.get(node.name, {})) for node in nodes]
    feasible = [node for node, fit in zip(nodes, fits, strict=True) if fit.fits]
    if not feasible:
        return Placement(pod.name, None, failure_message(fits))
    best = min(
        feasible,
        key=lambda n: (rank(n) if rank is not None else 0, -_free_share(n, used.get(n.name, {})), n.name),
    )
    return Placement(pod.name, best.name, "")


def schedule(
    pending: Sequence[PodView],
    nodes: Sequence[Node],
    bound: Iterable[PodView],
    rank: NodeRank | None = None,
) -> list[Placement]:
    """Place pending pods one by one (oldest first, then name), each placement using up room for the next."""
    used = usage_by_node(bound)
    placements = []
    for pod in sorted(pending, key=lambda p: (p.created_at, p.name)):
        placement = pick_node(pod, nodes, used, rank)
        placements.append(placement)
        if placement.node is not None:
            add_usage(used.setdefault(placement.node, {}), pod)
    return placements
