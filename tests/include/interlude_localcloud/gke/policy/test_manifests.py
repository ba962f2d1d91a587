"""Pod manifests (the guide's pod template) to PodView, and Kubernetes quantities."""

from __future__ import annotations

from typing import Any

import pytest

from interlude_localcloud.gke.policy.manifests import parse_quantity, pod_from_manifest
from interlude_localcloud.gke.policy.scheduling import check

from .guide import GIB, GPU_POOL, TPU_POOL


def guide_pod(**spec: Any) -> dict[str, Any]:
    """The pod template of Google's TPU/GPU vLLM guide, as a stored pod."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vllm-abc", "ownerReferences": [{"kind": "ReplicaSet", "name": "vllm-5d8"}]},
        "spec": {
            "nodeSelector": {"cloud.google.com/compute-class": "vllm-fallback"},
            "containers": [
                {"name": "vllm-gpu", "resources": {"limits": {"ephemeral-storage": "43Gi"}}},
                {"name": "vllm-tpu"},
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
            ],
            **spec,
        },
    }


def test_guide_pod_schedules_on_both_pools_and_one_per_node() -> None:
    pod = pod_from_manifest(guide_pod(), created_at=5.0)
    assert pod.name == "vllm-abc" and pod.owner == "vllm-5d8" and pod.created_at == 5.0
    assert pod.compute_class == "vllm-fallback" and pod.node_name is None
    assert pod.requests == {"ephemeral-storage": 43 * GIB}  # limits become requests
    for pool in (TPU_POOL, GPU_POOL):
        node = pool.new_node("n")
        assert check(pod, node, {}).fits
        assert not check(pod, node, {"ephemeral-storage": 43 * GIB}).fits


def test_affinity_init_containers_and_node_name() -> None:
    pod = pod_from_manifest(
        guide_pod(
            nodeName="l4-0",
            initContainers=[{"name": "fetch", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}],
            containers=[{"name": "c", "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1"}}}],
            affinity={
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "cloud.google.com/scheduled-maintenance-time", "operator": "DoesNotExist"}
                                ]
                            }
                        ]
                    }
                }
            },
        )
    )
    assert pod.node_name == "l4-0"
    assert pod.requests == {"cpu": 2.0, "memory": float(GIB)}  # the init container's peak wins
    [term] = pod.required_affinity
    assert term.match_expressions[0].operator == "DoesNotExist"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"tolerations": [{"key": "k", "operator": "Maybe"}]}, "Equal or Exists"),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Near"}]}]
                        }
                    }
                }
            },
            "not one of",
        ),
        ({"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}, "not a Kubernetes quantity"),
    ],
)
def test_bad_pods_fail_loudly(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pod_from_manifest(guide_pod(**spec))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1.0),
        ("500m", 0.5),
        ("43Gi", 43 * 2.0**30),
        ("1k", 1000.0),
        ("2M", 2e6),
        ("1.5", 1.5),
        ("1e3", 1000.0),
        ("128Mi", 128 * 2.0**20),
        (3, 3.0),
        ("0.5Ki", 512.0),
    ],
)
def test_quantities(text: str | int, value: float) -> None:
    assert parse_quantity(text) == value
