"""kube-scheduler filters and the deterministic pick, table by table."""

from __future__ import annotations

from dataclasses import replace

import pytest

from interlude_localcloud.gke.policy.model import (
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodView,
    Taint,
    Toleration,
)
from interlude_localcloud.gke.policy.scheduling import check, failure_message, pick_node, schedule, usage_by_node

from .guide import GIB, GPU_POOL, TPU_POOL, node_of, vllm_pod

AVOID_MAINTENANCE = (
    NodeSelectorTerm((NodeSelectorRequirement("cloud.google.com/scheduled-maintenance-time", "DoesNotExist"),)),
)


def _with_labels(node: Node, **labels: str) -> Node:
    return replace(node, labels={**node.labels, **labels})


@pytest.mark.parametrize(
    ("pod", "node", "fits", "reason"),
    [
        (vllm_pod("p"), node_of(TPU_POOL), True, ""),
        (vllm_pod("p"), node_of(GPU_POOL), True, ""),
        (vllm_pod("p"), node_of(TPU_POOL, ready=False), False, "node(s) were not ready"),
        (vllm_pod("p"), replace(node_of(TPU_POOL), unschedulable=True), False, "node(s) were unschedulable"),
        # no toleration for the TPU taint (the class toleration is added by GKE, not the TPU one)
        (
            replace(vllm_pod("p"), tolerations=()),
            node_of(TPU_POOL),
            False,
            "node(s) had untolerated taint {google.com/tpu: present}",
        ),
        # a pod without the class selector does not tolerate the class taint
        (
            replace(vllm_pod("p"), node_selector={}),
            node_of(GPU_POOL),
            False,
            "node(s) had untolerated taint {cloud.google.com/compute-class: vllm-fallback}",
        ),
        (
            replace(vllm_pod("p"), node_selector={"cloud.google.com/compute-class": "other"}),
            node_of(GPU_POOL),
            False,
            "node(s) didn't match Pod's node affinity/selector",
        ),
        (
            replace(vllm_pod("p"), requests={"ephemeral-storage": 48 * GIB}),
            node_of(GPU_POOL),
            False,
            "Insufficient ephemeral-storage",
        ),
        (replace(vllm_pod("p"), requests={"cpu": 8.0}), node_of(GPU_POOL), False, "Insufficient cpu"),
        (
            replace(vllm_pod("p"), requests={"nvidia.com/gpu": 1.0}),
            node_of(TPU_POOL),
            False,
            "Insufficient nvidia.com/gpu",
        ),
        (replace(vllm_pod("p"), requests={"nvidia.com/gpu": 1.0}, tolerations=()), node_of(GPU_POOL), True, ""),
        (replace(vllm_pod("p"), required_affinity=AVOID_MAINTENANCE), node_of(GPU_POOL), True, ""),
        (
            replace(vllm_pod("p"), required_affinity=AVOID_MAINTENANCE),
            _with_labels(node_of(GPU_POOL), **{"cloud.google.com/scheduled-maintenance-time": "1700000000"}),
            False,
            "node(s) didn't match Pod's node affinity/selector",
        ),
        (vllm_pod("p"), replace(node_of(GPU_POOL), taints=(Taint("x", "PreferNoSchedule"),)), True, ""),
        (
            vllm_pod("p"),
            replace(node_of(GPU_POOL), taints=(Taint("cloud.google.com/impending-node-termination", "NoSchedule"),)),
            False,
            "node(s) had untolerated taint {cloud.google.com/impending-node-termination: }",
        ),
        (
            replace(vllm_pod("p"), tolerations=(Toleration("", "Exists"),)),
            replace(node_of(GPU_POOL), taints=(Taint("x", "NoExecute"),)),
            True,
            "",
        ),
    ],
)
def test_filters(pod: PodView, node: Node, fits: bool, reason: str) -> None:
    result = check(pod, node, {})
    assert (result.fits, result.reason) == (fits, reason)


def test_affinity_terms_are_ored() -> None:
    terms = (
        NodeSelectorTerm((NodeSelectorRequirement("a", "In", ("1",)),)),
        NodeSelectorTerm((NodeSelectorRequirement("b", "Exists"), NodeSelectorRequirement("c", "DoesNotExist"))),
    )
    pod = replace(vllm_pod("p"), required_affinity=terms)
    node = node_of(GPU_POOL)
    assert not check(pod, node, {}).fits
    assert check(pod, _with_labels(node, a="1"), {}).fits
    assert check(pod, _with_labels(node, b="x"), {}).fits
    assert not check(pod, _with_labels(node, b="x", c="y"), {}).fits


def test_bound_pods_use_up_room_one_vllm_pod_per_node() -> None:
    nodes = [node_of(TPU_POOL), node_of(GPU_POOL)]
    placements = schedule([vllm_pod("a"), vllm_pod("b"), vllm_pod("c")], nodes, [], rank=None)
    placed = [p.node for p in placements]
    assert sorted(n for n in placed if n) == ["l4-0", "v6e-1-0"] and placed.count(None) == 1
    stuck = next(p for p in placements if p.node is None)
    assert stuck.message == "0/2 nodes are available: 2 Insufficient ephemeral-storage."


def test_rank_prefers_the_class_priority() -> None:
    nodes = [node_of(GPU_POOL), node_of(TPU_POOL)]
    rank = {"l4": 1, "v6e-1": 0}
    assert pick_node(vllm_pod("a"), nodes, {}, lambda n: rank[n.pool]).node == "v6e-1-0"
    assert pick_node(vllm_pod("a"), nodes, {}, lambda n: -rank[n.pool]).node == "l4-0"


def test_without_rank_least_allocated_then_name() -> None:
    a, b = GPU_POOL.new_node("b-node"), GPU_POOL.new_node("a-node")
    used = usage_by_node([replace(vllm_pod("x", node="a-node"), requests={"cpu": 1.0})])
    small_pod = replace(vllm_pod("y"), requests={"cpu": 0.5})
    assert pick_node(small_pod, [a, b], used).node == "b-node"  # a-node is busier
    assert pick_node(small_pod, [a, b], {}).node == "a-node"  # a tie: by name


def test_failure_message_sorted_and_counted() -> None:
    nodes = [node_of(TPU_POOL, 0, ready=False), node_of(GPU_POOL, 0), node_of(GPU_POOL, 1)]
    pod = replace(vllm_pod("p"), requests={"cpu": 100.0})
    assert pick_node(pod, nodes, {}).message == (
        "0/3 nodes are available: 1 node(s) were not ready, 2 Insufficient cpu."
    )
    assert failure_message([]) == "0/0 nodes are available."
