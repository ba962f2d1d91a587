"""What the GKE policies read: node pools, nodes, pods, ComputeClasses and zone capacity, as typed values.

The policies (scheduling, cluster autoscaler, HPA, maintenance) are pure functions over these types, so
the local cloud's controllers can call them from a reconcile loop and tests can call them from tables.
Labels and taints are the ones GKE puts on nodes, so a pod manifest written for Google schedules the same
way here:

- node pools and their labels/taints, TPU and GPU node labels:
  https://cloud.google.com/kubernetes-engine/docs/concepts/tpus and
  https://cloud.google.com/kubernetes-engine/docs/how-to/gpus
- ComputeClass: see compute_class.py
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

AcceleratorKind = Literal["tpu", "gpu", "none"]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
WhenUnsatisfiable = Literal["ScaleUpAnyway", "DoNotScaleUp"]
Operator = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]

# Labels GKE sets on nodes (and that pods select on).
LABEL_NODEPOOL = "cloud.google.com/gke-nodepool"
LABEL_COMPUTE_CLASS = "cloud.google.com/compute-class"
LABEL_MACHINE_FAMILY = "cloud.google.com/machine-family"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
LABEL_ZONE = "topology.kubernetes.io/zone"
LABEL_SPOT = "cloud.google.com/gke-spot"
LABEL_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
LABEL_GPU_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_GPU_COUNT = "cloud.google.com/gke-accelerator-count"
LABEL_GPU_DRIVER = "cloud.google.com/gke-gpu-driver-version"
# Taints GKE puts on accelerator nodes; pods tolerate them (GPU ones automatically when they request GPUs).
TAINT_TPU = "google.com/tpu"
TAINT_GPU = "nvidia.com/gpu"
RESOURCE_TPU = "google.com/tpu"
RESOURCE_GPU = "nvidia.com/gpu"
DEFAULT_WHEN_UNSATISFIABLE: WhenUnsatisfiable = "DoNotScaleUp"  # the default in current GKE versions
DEFAULT_CONSOLIDATION_DELAY_MINUTES = 10  # cluster autoscaler's scale-down-unneeded-time


def machine_family(machine_type: str) -> str:
    """``ct6e-standard-1t`` -> ``ct6e``, ``g2-standard-4`` -> ``g2``: the family is the first dash part."""
    return machine_type.split("-", 1)[0]


@dataclass(frozen=True)
class Taint:
    key: str
    effect: TaintEffect
    value: str = ""

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    """A pod toleration; an empty key with ``Exists`` tolerates everything, an empty effect every effect."""

    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class TpuSpec:
    type: str  # the GKE label value, e.g. "tpu-v6e-slice"
    topology: str  # e.g. "1x1"
    chips: int  # chips on one node (google.com/tpu allocatable)


@dataclass(frozen=True)
class GpuSpec:
    type: str  # e.g. "nvidia-l4"
    count: int
    driver_version: str = "latest"


@dataclass(frozen=True)
class NodePool:
    """A node pool: what every node of it looks like, and how far the autoscaler may scale it."""

    name: str
    zone: str
    machine_type: str
    allocatable: Mapping[str, float]  # per node: cpu (cores), memory (bytes), ephemeral-storage, pods
    min_nodes: int = 0
    max_nodes: int = 1
    spot: bool = False
    compute_class: str | None = None  # label + taint cloud.google.com/compute-class=NAME:NoSchedule
    tpu: TpuSpec | None = None
    gpu: GpuSpec | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    def __post_init__(self) -> None:
        if self.tpu is not None and self.gpu is not None:
            raise ValueError(f"node pool {self.name}: a node has TPUs or GPUs, not both")
        if not 0 <= self.min_nodes <= self.max_nodes:
            raise ValueError(f"node pool {self.name}: need 0 <= min_nodes <= max_nodes")

    @property
    def accelerator(self) -> AcceleratorKind:
        return "tpu" if self.tpu is not None else "gpu" if self.gpu is not None else "none"

    @property
    def machine_family(self) -> str:
        return machine_family(self.machine_type)

    def node_labels(self) -> dict[str, str]:
        """The labels GKE gives every node of this pool (plus the pool's own)."""
        labels = {
            LABEL_NODEPOOL: self.name,
            LABEL_MACHINE_FAMILY: self.machine_family,
            LABEL_INSTANCE_TYPE: self.machine_type,
            LABEL_ZONE: self.zone,
        }
        if self.spot:
            labels[LABEL_SPOT] = "true"
        if self.compute_class:
            labels[LABEL_COMPUTE_CLASS] = self.compute_class
        if self.tpu is not None:
            labels[LABEL_TPU_ACCELERATOR] = self.tpu.type
            labels[LABEL_TPU_TOPOLOGY] = self.tpu.topology
        if self.gpu is not None:
            labels[LABEL_GPU_ACCELERATOR] = self.gpu.type
            labels[LABEL_GPU_COUNT] = str(self.gpu.count)
            labels[LABEL_GPU_DRIVER] = self.gpu.driver_version
        labels.update(self.labels)
        return labels

    def node_taints(self) -> tuple[Taint, ...]:
        taints = list(self.taints)
        if self.tpu is not None:
            taints.append(Taint(TAINT_TPU, "NoSchedule", "present"))
        if self.gpu is not None:
            taints.append(Taint(TAINT_GPU, "NoSchedule", "present"))
        if self.compute_class:
            taints.append(Taint(LABEL_COMPUTE_CLASS, "NoSchedule", self.compute_class))
        return tuple(taints)

    def node_allocatable(self) -> dict[str, float]:
        allocatable = dict(self.allocatable)
        if self.tpu is not None:
            allocatable.setdefault(RESOURCE_TPU, float(self.tpu.chips))
        if self.gpu is not None:
            allocatable.setdefault(RESOURCE_GPU, float(self.gpu.count))
        allocatable.setdefault("pods", 110.0)
        return allocatable

    def new_node(self, name: str, created_at: float = 0.0, ready: bool = True) -> Node:
        """A node as this pool creates it (also the autoscaler's template for 'would a new node help?')."""
        return Node(
            name=name,
            pool=self.name,
            labels=self.node_labels(),
            taints=self.node_taints(),
            allocatable=self.node_allocatable(),
            ready=ready,
            created_at=created_at,
        )


@dataclass(frozen=True)
class Node:
    name: str
    pool: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, float]
    ready: bool = True
    created_at: float = 0.0
    unschedulable: bool = False  # cordoned (spec.unschedulable), e.g. being drained
    draining: bool = False

    @property
    def scheduled_maintenance_time(self) -> int | None:
        value = self.labels.get("cloud.google.com/scheduled-maintenance-time")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def zone(self) -> str:
        return self.labels.get(LABEL_ZONE, "")


@dataclass(frozen=True)
class NodeSelectorRequirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key, "")
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        return present and _compare_int(value, self.values, self.operator)


def _compare_int(value: str, values: tuple[str, ...], operator: str) -> bool:
    """Gt/Lt compare integers; a non-integer label or a malformed requirement does not match."""
    try:
        left, right = int(value), int(values[0])
    except (ValueError, IndexError):
        return False
    return left > right if operator == "Gt" else left < right


@dataclass(frozen=True)
class NodeSelectorTerm:
    """Requirements ANDed; a pod's required node affinity ORs its terms."""

    match_expressions: tuple[NodeSelectorRequirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(req.matches(labels) for req in self.match_expressions)


@dataclass(frozen=True)
class PodView:
    """The parts of a pod the scheduler and autoscaler act on."""

    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    requests: Mapping[str, float] = field(default_factory=dict)
    required_affinity: tuple[NodeSelectorTerm, ...] = ()
    node_name: str | None = None
    owner: str = ""  # e.g. the ReplicaSet; pods without one block scale-down in the real autoscaler
    created_at: float = 0.0
    labels: Mapping[str, str] = field(default_factory=dict)
    # required podAntiAffinity terms with topologyKey kubernetes.io/hostname, as their matchLabels: no two pods
    # matching one of them on the same node (what keeps one vLLM replica per accelerator node)
    anti_affinity: tuple[Mapping[str, str], ...] = ()

    @property
    def compute_class(self) -> str | None:
        return self.node_selector.get(LABEL_COMPUTE_CLASS)

    def usage(self) -> dict[str, float]:
        """What this pod takes on its node: its requests, one "pods", and one of each of its own anti-affinity
        terms it matches (so a node's usage says which terms a pod there already holds)."""
        out = {**self.requests, "pods": self.requests.get("pods", 0.0) + 1.0}
        for term in self.anti_affinity:
            if all(self.labels.get(k) == v for k, v in term.items()):
                out[anti_affinity_key(term)] = out.get(anti_affinity_key(term), 0.0) + 1.0
        return out

    def effective_tolerations(self) -> tuple[Toleration, ...]:
        """GKE adds a toleration for the class taint to pods that select a ComputeClass, and for the
        GPU taint to pods that request GPUs (the ExtendedResourceToleration admission plugin)."""
        extra: list[Toleration] = []
        if self.compute_class:
            extra.append(Toleration(LABEL_COMPUTE_CLASS, "Equal", self.compute_class, "NoSchedule"))
        if self.requests.get(RESOURCE_GPU, 0) > 0:
            extra.append(Toleration(TAINT_GPU, "Exists", "", "NoSchedule"))
        if self.requests.get(RESOURCE_TPU, 0) > 0:
            extra.append(Toleration(TAINT_TPU, "Exists", "", "NoSchedule"))
        return self.tolerations + tuple(extra)


def anti_affinity_key(match_labels: Mapping[str, str]) -> str:
    """The usage key of a hostname anti-affinity term (not a resource name: it cannot clash with one)."""
    return "podAntiAffinity/" + ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


# ----------------------------------------------------------------- capacity
@dataclass(frozen=True)
class CapacityEntry:
    """What Compute Engine can still hand out in one zone for one machine type."""

    zone: str
    machine_type: str
    available_nodes: int | None = None  # None: no limit modelled
    stockout: bool = False  # scale-up fails as GCE_STOCKOUT / ZONE_RESOURCE_POOL_EXHAUSTED does


@dataclass(frozen=True)
class ZoneCapacity:
    entries: tuple[CapacityEntry, ...] = ()

    def lookup(self, zone: str, machine_type: str) -> CapacityEntry:
        for entry in self.entries:
            if entry.zone == zone and entry.machine_type == machine_type:
                return entry
        return CapacityEntry(zone, machine_type)

    @classmethod
    def of(cls, entries: Iterable[CapacityEntry]) -> ZoneCapacity:
        return cls(tuple(entries))
