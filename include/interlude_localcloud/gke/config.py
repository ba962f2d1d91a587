"""The scenario's `gke:` section: clusters and their node pools, as typed objects.

Node pool facts (machine type, TPU topology, GPU type/count, spot, autoscaling bounds) follow the
fields of Google's NodePool resource (https://cloud.google.com/kubernetes-engine/docs/reference/rest/v1/projects.locations.clusters.nodePools)
and the node labels GKE sets on TPU and GPU nodes
(https://cloud.google.com/kubernetes-engine/docs/how-to/tpus, https://cloud.google.com/kubernetes-engine/docs/how-to/gpus).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_K8S_VERSION = "1.33.5-gke.1080000"


@dataclass(frozen=True)
class TpuSpec:
    """A TPU slice node pool: GKE accelerator label value, topology and chips per node."""

    accelerator: str  # e.g. tpu-v6e-slice (label cloud.google.com/gke-tpu-accelerator)
    topology: str  # e.g. 2x2 (label cloud.google.com/gke-tpu-topology)
    chips: int = 4


@dataclass(frozen=True)
class GpuSpec:
    type: str  # e.g. nvidia-l4 (label cloud.google.com/gke-accelerator)
    count: int = 1


# Kubernetes taint effects <-> the Container API's NodeTaint.effect enum.
EFFECTS = {"NoSchedule": "NO_SCHEDULE", "PreferNoSchedule": "PREFER_NO_SCHEDULE", "NoExecute": "NO_EXECUTE"}
COMPUTE_CLASS_KEY = "cloud.google.com/compute-class"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # Kubernetes form: NoSchedule | PreferNoSchedule | NoExecute


@dataclass
class NodePoolSpec:
    name: str
    machine_type: str
    min_nodes: int = 0
    max_nodes: int = 3
    initial_nodes: int = 0
    spot: bool = False
    zones: list[str] = field(default_factory=list)
    tpu: TpuSpec | None = None
    gpu: GpuSpec | None = None
    labels: dict[str, str] = field(default_factory=dict)
    # NodeConfig.metadata: key/values the pool's VMs carry (GKE keeps and lists them; its own keys are reserved)
    metadata: dict[str, str] = field(default_factory=dict)
    taints: list[Taint] = field(default_factory=list)
    # The cluster autoscaler manages only pools with autoscaling enabled (min/max are its bounds)
    # (https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-autoscaler).
    autoscaling: bool = False


@dataclass
class ClusterSpec:
    name: str
    location: str
    kubernetes_version: str = DEFAULT_K8S_VERSION
    node_pools: list[NodePoolSpec] = field(default_factory=list)
    # image glob -> {command name: local argv}: what a container of that image runs here (see kubelet.py)
    images: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    run: bool = False  # gke.run: the reconcile loop (scheduler, autoscaler, kubelet, Services, HPA) runs

    @property
    def minor_version(self) -> str:
        """Major.minor ("1.33" from "1.33.5-gke.1080000"): the schema set kubernetes-validate uses."""
        major, minor = self.kubernetes_version.split(".")[:2]
        return f"{major}.{minor}"


_POOL_KEYS = {
    "name",
    "machine_type",
    "min_nodes",
    "max_nodes",
    "initial_nodes",
    "spot",
    "zones",
    "tpu",
    "gpu",
    "labels",
    "taints",
    "compute_class",
    "autoscaling",
}


def _pool_labels_taints(raw: dict[str, Any]) -> tuple[dict[str, str], list[Taint]]:
    """`compute_class: X` is GKE's recipe for a manually created pool a ComputeClass names: the node label
    and the NoSchedule taint cloud.google.com/compute-class=X
    (https://cloud.google.com/kubernetes-engine/docs/how-to/create-manage-compute-classes)."""
    labels = {str(k): str(v) for k, v in (raw.get("labels") or {}).items()}
    taints = [
        Taint(str(t["key"]), str(t.get("value", "")), str(t.get("effect", "NoSchedule")))
        for t in raw.get("taints") or []
    ]
    if raw.get("compute_class"):
        cc = str(raw["compute_class"])
        labels[COMPUTE_CLASS_KEY] = cc
        taints.append(Taint(COMPUTE_CLASS_KEY, cc, "NoSchedule"))
    for t in taints:
        if t.effect not in EFFECTS:
            raise ValueError(f"unknown taint effect {t.effect!r}")
    return labels, taints


def _pool(raw: dict[str, Any], location: str) -> NodePoolSpec:
    unknown = set(raw) - _POOL_KEYS
    if unknown:
        raise ValueError(f"unknown gke node pool keys: {sorted(unknown)}")
    tpu = raw.get("tpu")
    gpu = raw.get("gpu")
    zones = list(raw.get("zones") or ([location] if location.count("-") == 2 else [f"{location}-a"]))
    labels, taints = _pool_labels_taints(raw)
    return NodePoolSpec(
        name=str(raw["name"]),
        machine_type=str(raw["machine_type"]),
        min_nodes=int(raw.get("min_nodes", 0)),
        max_nodes=int(raw.get("max_nodes", 3)),
        initial_nodes=int(raw.get("initial_nodes", raw.get("min_nodes", 0))),
        spot=bool(raw.get("spot", False)),
        zones=zones,
        tpu=TpuSpec(str(tpu["accelerator"]), str(tpu["topology"]), int(tpu.get("chips", 4))) if tpu else None,
        gpu=GpuSpec(str(gpu["type"]), int(gpu.get("count", 1))) if gpu else None,
        labels=labels,
        taints=taints,
        autoscaling=bool(raw.get("autoscaling", False)),
    )


def parse_gke(raw: dict[str, Any] | None) -> list[ClusterSpec]:
    """`gke: {clusters: [{name, location, kubernetes_version, node_pools: [...]}]}` -> ClusterSpecs."""
    if not raw:
        return []
    unknown = set(raw) - {"clusters", "images", "run"}
    if unknown:
        raise ValueError(f"unknown gke keys: {sorted(unknown)}")
    out: list[ClusterSpec] = []
    for c in raw.get("clusters") or []:
        location = str(c["location"])
        out.append(
            ClusterSpec(
                name=str(c["name"]),
                location=location,
                kubernetes_version=str(c.get("kubernetes_version", DEFAULT_K8S_VERSION)),
                node_pools=[_pool(p, location) for p in c.get("node_pools") or []],
                images={
                    str(k): {str(n): [str(a) for a in argv] for n, argv in (v or {}).items()}
                    for k, v in (raw.get("images") or {}).items()
                },
                run=bool(raw.get("run", False)),
            )
        )
    return out
