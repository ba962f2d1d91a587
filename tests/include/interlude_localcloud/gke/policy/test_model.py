"""ComputeClass manifests parsed as GKE writes them; node pools' labels/taints; priority matching."""

from __future__ import annotations

from typing import Any

import pytest

from interlude_localcloud.gke.policy.compute_class import ComputeClass
from interlude_localcloud.gke.policy.model import (
    CapacityEntry,
    NodePool,
    NodeSelectorRequirement,
    Taint,
    Toleration,
    ZoneCapacity,
    machine_family,
)

from .guide import CLASS, GPU_POOL, TPU_POOL, class_manifest


def test_guide_class_parses_with_gke_defaults() -> None:
    cls = ComputeClass.from_manifest(class_manifest())
    assert cls.name == CLASS
    assert [r.tpu.type if r.tpu else None for r in cls.priorities] == ["tpu-v6e-slice", None]
    assert cls.priorities[1].gpu is not None and cls.priorities[1].gpu.type == "nvidia-l4"
    assert cls.when_unsatisfiable == "DoNotScaleUp"
    assert cls.optimize_rule_priority is False and cls.consolidation_delay_minutes is None


def test_full_spec_fields_are_read() -> None:
    cls = ComputeClass.from_manifest(
        class_manifest(
            whenUnsatisfiable="ScaleUpAnyway",
            activeMigration={"optimizeRulePriority": True},
            autoscalingPolicy={"consolidationDelayMinutes": 3},
            nodePoolAutoCreation={"enabled": True},
        )
    )
    assert (cls.when_unsatisfiable, cls.optimize_rule_priority, cls.consolidation_delay_minutes) == (
        "ScaleUpAnyway",
        True,
        3,
    )
    assert cls.node_pool_auto_creation is True


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda m: m.update(kind="Deployment"), "not a cloud.google.com/v1 ComputeClass"),
        (lambda m: m.update(apiVersion="cloud.google.com/v1beta1"), "not a cloud.google.com/v1"),
        (lambda m: m["metadata"].pop("name"), "metadata.name"),
        (lambda m: m["spec"].update(priorities=[]), "non-empty list"),
        (lambda m: m["spec"].update(whenUnsatisfiable="Sometimes"), "whenUnsatisfiable"),
        (lambda m: m["spec"].update(autoscalingPolicy={"consolidationDelayMinutes": 0}), ">= 1"),
        (lambda m: m["spec"].update(priorities=[{"tpu": {"count": 1}}]), "needs a type"),
        (lambda m: m["spec"].update(priorities=["tpu"]), "must be a mapping"),
    ],
)
def test_bad_manifests_fail_loudly(mutate: Any, message: str) -> None:
    manifest = class_manifest()
    mutate(manifest)
    with pytest.raises(ValueError, match=message):
        ComputeClass.from_manifest(manifest)


@pytest.mark.parametrize(
    ("rule", "pool", "expected"),
    [
        ({"nodepools": ["v6e-1"]}, TPU_POOL, 0),
        ({"nodepools": ["other"]}, TPU_POOL, None),
        ({"tpu": {"type": "tpu-v6e-slice", "topology": "1x1"}}, TPU_POOL, 0),
        ({"tpu": {"type": "tpu-v6e-slice", "topology": "2x2"}}, TPU_POOL, None),
        ({"tpu": {"type": "tpu-v6e-slice", "count": 4}}, TPU_POOL, None),
        ({"tpu": {"type": "tpu-v5-lite-podslice"}}, TPU_POOL, None),
        ({"gpu": {"type": "nvidia-l4", "count": 1}}, GPU_POOL, 0),
        ({"gpu": {"type": "nvidia-l4", "count": 2}}, GPU_POOL, None),
        ({"gpu": {"type": "nvidia-l4"}}, TPU_POOL, None),
        ({"machineFamily": "g2"}, GPU_POOL, 0),
        ({"machineFamily": "g2", "spot": True}, GPU_POOL, None),
        ({"machineFamily": "ct6e", "spot": True}, TPU_POOL, 0),
        ({"machineType": "g2-standard-4"}, GPU_POOL, 0),
    ],
)
def test_priority_rules_match_pools(rule: dict[str, Any], pool: NodePool, expected: int | None) -> None:
    manifest = class_manifest()
    manifest["spec"]["priorities"] = [rule]
    assert ComputeClass.from_manifest(manifest).rank(pool) == expected


def test_pool_of_another_class_never_ranks() -> None:
    manifest = class_manifest()
    manifest["metadata"]["name"] = "other-class"
    assert ComputeClass.from_manifest(manifest).rank(TPU_POOL) is None


def test_pool_nodes_carry_gke_labels_and_taints() -> None:
    node = TPU_POOL.new_node("n1")
    assert node.labels["cloud.google.com/gke-nodepool"] == "v6e-1"
    assert node.labels["cloud.google.com/gke-tpu-accelerator"] == "tpu-v6e-slice"
    assert node.labels["cloud.google.com/gke-tpu-topology"] == "1x1"
    assert node.labels["cloud.google.com/gke-spot"] == "true"
    assert node.labels["cloud.google.com/compute-class"] == CLASS
    assert node.labels["topology.kubernetes.io/zone"] == TPU_POOL.zone
    assert node.allocatable["google.com/tpu"] == 1.0 and node.allocatable["pods"] == 110.0
    assert {str(t) for t in node.taints} == {
        "google.com/tpu=present:NoSchedule",
        f"cloud.google.com/compute-class={CLASS}:NoSchedule",
    }
    gpu_node = GPU_POOL.new_node("g1")
    assert gpu_node.labels["cloud.google.com/gke-accelerator"] == "nvidia-l4"
    assert "cloud.google.com/gke-spot" not in gpu_node.labels
    assert Taint("nvidia.com/gpu", "NoSchedule", "present") in gpu_node.taints
    assert TPU_POOL.accelerator == "tpu" and GPU_POOL.accelerator == "gpu" and machine_family("e2-medium") == "e2"


def test_pool_validation() -> None:
    with pytest.raises(ValueError, match="min_nodes"):
        NodePool("p", "z", "e2-medium", {}, min_nodes=3, max_nodes=1)


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (Toleration("a", "Exists"), Taint("a", "NoSchedule", "x"), True),
        (Toleration("a", "Equal", "x"), Taint("a", "NoSchedule", "x"), True),
        (Toleration("a", "Equal", "y"), Taint("a", "NoSchedule", "x"), False),
        (Toleration("a", "Exists", effect="NoExecute"), Taint("a", "NoSchedule"), False),
        (Toleration("", "Exists"), Taint("anything", "NoExecute"), True),
        (Toleration("b", "Exists"), Taint("a", "NoSchedule"), False),
    ],
)
def test_tolerations(toleration: Toleration, taint: Taint, expected: bool) -> None:
    assert toleration.tolerates(taint) is expected


@pytest.mark.parametrize(
    ("req", "labels", "expected"),
    [
        (NodeSelectorRequirement("k", "In", ("a", "b")), {"k": "b"}, True),
        (NodeSelectorRequirement("k", "In", ("a",)), {}, False),
        (NodeSelectorRequirement("k", "NotIn", ("a",)), {}, True),
        (NodeSelectorRequirement("k", "NotIn", ("a",)), {"k": "a"}, False),
        (NodeSelectorRequirement("k", "Exists"), {"k": ""}, True),
        (NodeSelectorRequirement("k", "DoesNotExist"), {"k": "1"}, False),
        (NodeSelectorRequirement("k", "Gt", ("100",)), {"k": "101"}, True),
        (NodeSelectorRequirement("k", "Gt", ("100",)), {"k": "100"}, False),
        (NodeSelectorRequirement("k", "Lt", ("100",)), {"k": "99"}, True),
        (NodeSelectorRequirement("k", "Gt", ("100",)), {"k": "soon"}, False),
        (NodeSelectorRequirement("k", "Gt", ()), {"k": "5"}, False),
    ],
)
def test_node_selector_requirements(req: NodeSelectorRequirement, labels: dict[str, str], expected: bool) -> None:
    assert req.matches(labels) is expected


def test_zone_capacity_lookup_defaults_to_unlimited() -> None:
    capacity = ZoneCapacity.of([CapacityEntry("z", "ct6e-standard-1t", 0, stockout=True)])
    assert capacity.lookup("z", "ct6e-standard-1t").stockout is True
    other = capacity.lookup("z", "g2-standard-4")
    assert other.available_nodes is None and other.stockout is False
