"""Stored objects and scenario pools -> the typed views the pure policies take (policy/model.py)."""

from __future__ import annotations

from typing import Any

from interlude_localcloud.gke.config import COMPUTE_CLASS_KEY, NodePoolSpec
from interlude_localcloud.gke.policy import model
from interlude_localcloud.gke.policy.manifests import parse_quantity

POOL_LABEL = model.LABEL_NODEPOOL


def pool_view(spec: NodePoolSpec, allocatable: dict[str, float]) -> model.NodePool:
    """A scenario/Container API pool as the autoscaler sees it (labels/taints of its own are kept)."""
    own_labels = {k: v for k, v in spec.labels.items() if k != COMPUTE_CLASS_KEY}
    own_taints = tuple(
        model.Taint(t.key, t.effect, t.value)
        for t in spec.taints  # type: ignore[arg-type]
        if t.key != COMPUTE_CLASS_KEY
    )
    return model.NodePool(
        name=spec.name,
        zone=spec.zones[0],
        machine_type=spec.machine_type,
        allocatable=allocatable,
        min_nodes=spec.min_nodes,
        max_nodes=spec.max_nodes,
        spot=spec.spot,
        compute_class=spec.labels.get(COMPUTE_CLASS_KEY),
        tpu=model.TpuSpec(spec.tpu.accelerator, spec.tpu.topology, spec.tpu.chips) if spec.tpu else None,
        gpu=model.GpuSpec(spec.gpu.type, spec.gpu.count) if spec.gpu else None,
        labels=own_labels,
        taints=own_taints,
    )


def quantities(raw: dict[str, Any]) -> dict[str, float]:
    return {k: parse_quantity(v) for k, v in raw.items()}


def is_ready(node: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )


def node_view(node: dict[str, Any], created_at: float = 0.0) -> model.Node:
    meta, spec = node["metadata"], node.get("spec") or {}
    labels = dict(meta.get("labels") or {})
    return model.Node(
        name=meta["name"],
        pool=labels.get(POOL_LABEL, ""),
        labels=labels,
        taints=tuple(model.Taint(t["key"], t["effect"], t.get("value", "")) for t in spec.get("taints") or []),
        allocatable=quantities((node.get("status") or {}).get("allocatable") or {}),
        ready=is_ready(node),
        created_at=created_at,
        unschedulable=bool(spec.get("unschedulable")),
    )
