"""The cluster of Google's TPU/GPU vLLM guide as policy values: a TPU v6e pool limited to one node first,
an L4 pool second, one ComputeClass, pods that select it and tolerate both accelerator taints."""

from __future__ import annotations

from typing import Any

from interlude_localcloud.gke.policy.compute_class import ComputeClass
from interlude_localcloud.gke.policy.model import (
    GpuSpec,
    Node,
    NodePool,
    PodView,
    Toleration,
    TpuSpec,
)

GIB = 1024.0**3
CLASS = "vllm-fallback"
ZONE = "us-east5-b"


def class_manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cloud.google.com/v1",
        "kind": "ComputeClass",
        "metadata": {"name": CLASS},
        "spec": {
            "priorities": [
                {"tpu": {"type": "tpu-v6e-slice", "count": 1, "topology": "1x1"}},
                {"gpu": {"type": "nvidia-l4", "count": 1, "driverVersion": "latest"}},
            ],
            **spec,
        },
    }


def compute_class(**spec: Any) -> ComputeClass:
    return ComputeClass.from_manifest(class_manifest(**spec))


TPU_POOL = NodePool(
    name="v6e-1",
    zone=ZONE,
    machine_type="ct6e-standard-1t",
    allocatable={"cpu": 43.0, "memory": 440 * GIB, "ephemeral-storage": 47 * GIB},
    min_nodes=0,
    max_nodes=1,
    spot=True,
    compute_class=CLASS,
    tpu=TpuSpec("tpu-v6e-slice", "1x1", 1),
)
GPU_POOL = NodePool(
    name="l4",
    zone=ZONE,
    machine_type="g2-standard-4",
    allocatable={"cpu": 3.9, "memory": 13 * GIB, "ephemeral-storage": 47 * GIB},
    min_nodes=0,
    max_nodes=4,
    compute_class=CLASS,
    gpu=GpuSpec("nvidia-l4", 1),
)
POOLS = (TPU_POOL, GPU_POOL)

TOLERATIONS = (
    Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
    Toleration("google.com/tpu", "Exists", "", "NoSchedule"),
)


def vllm_pod(name: str, node: str | None = None, created_at: float = 0.0) -> PodView:
    """A guide pod: class selector, both tolerations, 43Gi of ephemeral storage (one pod per node)."""
    return PodView(
        name=name,
        node_selector={"cloud.google.com/compute-class": CLASS},
        tolerations=TOLERATIONS,
        requests={"ephemeral-storage": 43 * GIB, "cpu": 1.0},
        node_name=node,
        owner="vllm-rs",
        created_at=created_at,
    )


def node_of(pool: NodePool, index: int = 0, ready: bool = True, created_at: float = 0.0) -> Node:
    return pool.new_node(f"{pool.name}-{index}", created_at=created_at, ready=ready)
