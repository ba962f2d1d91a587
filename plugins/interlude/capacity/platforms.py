"""Which platform offers which accelerator: the Cloud TPU API, Compute Engine, GKE (pure, table-driven).

Google now sells TPUs through three surfaces, and they do not offer the same things:

- The Cloud TPU API (nodes and queued resources) serves TPU v2 to v6e, single- and multi-host, and says of
  itself "For Ironwood (TPU7x), you must use Google Kubernetes Engine (GKE)"
  (https://cloud.google.com/tpu/docs/queued-resources).
- Compute Engine documents v5p, v6e and TPU7x as machine types of its accelerator-optimized family: one instance
  is one TPU VM (a single-host slice) created with ``instances.insert``
  (https://cloud.google.com/compute/docs/tpus/tpu-machines,
  https://cloud.google.com/compute/docs/tpus/create-tpu-vm-instance). A multi-host slice is several instances
  joined by a workload policy: Interlude does not build those on Compute Engine, so only the single-host
  shapes below are offered there. TPU7x is left out although its machine type exists: Google's way to
  provision TPU7x is GKE (https://cloud.google.com/tpu/docs/tpu7x-training names GKE, XPK on GKE and
  Cluster Director on GKE, nothing else).
- GKE node pools carry every TPU generation GKE supports, TPU7x included
  (https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood), and GPUs.

GPUs are Compute Engine VMs or GKE nodes, never the TPU API. Nothing here talks to the cloud: the capacity
probe asks each platform what it offers in a zone, this module says which platform may be asked at all
and under which Compute Engine machine type.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from interlude.capacity.report import AcceleratorKind, kind_of


class Platform(StrEnum):
    """Where a stage can run (the run param ``platforms``)."""

    TPU_API = "tpu_api"
    COMPUTE = "compute"
    GKE = "gke"


PLATFORM_NAMES: Mapping[Platform, str] = {
    Platform.TPU_API: "Cloud TPU API",
    Platform.COMPUTE: "Compute Engine",
    Platform.GKE: "GKE",
}

SOURCES: Mapping[Platform, str] = {
    Platform.TPU_API: "https://cloud.google.com/tpu/docs/queued-resources",
    Platform.COMPUTE: "https://cloud.google.com/compute/docs/tpus/tpu-machines",
    Platform.GKE: "https://cloud.google.com/kubernetes-engine/docs/concepts/tpus",
}


@dataclass(frozen=True)
class ComputeTpuShape:
    """A TPU slice as one Compute Engine instance: its machine type and the OS image Google names for it.

    ``image_family`` / ``image_project``: the TPU-optimized Ubuntu images Google manages for TPU VMs
    (https://cloud.google.com/tpu/docs/tpu-os-images), used when creating a TPU instance on Compute Engine.
    """

    accelerator_type: str  # TPU API naming: v6e-8 (chips), v5p-8 (TensorCores)
    machine_type: str
    chips: int
    image_family: str
    image_project: str = "ubuntu-os-accelerator-images"


# v5p and v6e TPU VM images: one family covers v5e, v5p and v6e (the name says so).
TPU_V5_V6_IMAGE = "ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"

# Compute Engine TPU machine types (https://cloud.google.com/compute/docs/tpus/tpu-machines): v6e 1, 4 and 8 chips
# per VM (ct6e-standard-1t/4t/8t), v5p 4 chips (ct5p-hightpu-4t = v5p-8: v5p types count TensorCores, 2 per chip).
COMPUTE_TPU_SHAPES: Mapping[str, ComputeTpuShape] = {
    s.accelerator_type: s
    for s in (
        ComputeTpuShape("v6e-1", "ct6e-standard-1t", 1, TPU_V5_V6_IMAGE),
        ComputeTpuShape("v6e-4", "ct6e-standard-4t", 4, TPU_V5_V6_IMAGE),
        ComputeTpuShape("v6e-8", "ct6e-standard-8t", 8, TPU_V5_V6_IMAGE),
        ComputeTpuShape("v5p-8", "ct5p-hightpu-4t", 4, TPU_V5_V6_IMAGE),
    )
}
COMPUTE_TPU_BY_MACHINE_TYPE: Mapping[str, ComputeTpuShape] = {s.machine_type: s for s in COMPUTE_TPU_SHAPES.values()}

# TPU7x (Ironwood): served on GKE only (see the module docstring). TPU API naming counts TensorCores, 2 per chip,
# 4 chips per VM: tpu7x-8 is one VM (2x2x1), larger slices are whole VMs.
TPU7X = re.compile(r"^tpu7x-(?P<cores>[1-9][0-9]*)$")
TPU7X_SOURCE = "https://cloud.google.com/tpu/docs/tpu7x-training"


def is_tpu7x(accelerator_type: str) -> bool:
    return accelerator_type.startswith(("tpu7x-", "v7x-"))


def tpu7x_problem(accelerator_type: str) -> str | None:
    """None when ``accelerator_type`` is a TPU7x type of whole 4-chip VMs (tpu7x-8, tpu7x-16, ...), else why not."""
    m = TPU7X.match(accelerator_type)
    if m is None or int(m.group("cores")) % 8:
        return (
            f"{accelerator_type!r}: TPU7x types are tpu7x-N with N the TensorCores (2 per chip) of whole "
            f"4-chip VMs: tpu7x-8, tpu7x-16, ... ({TPU7X_SOURCE})"
        )
    return None


def offered_on(accelerator_type: str) -> tuple[Platform, ...]:
    """The platforms that can offer ``accelerator_type`` at all, in the table's order (before any zone is asked)."""
    if kind_of(accelerator_type) == AcceleratorKind.GPU:
        return (Platform.COMPUTE, Platform.GKE)
    if is_tpu7x(accelerator_type):
        return (Platform.GKE,)
    if accelerator_type in COMPUTE_TPU_SHAPES:
        return (Platform.TPU_API, Platform.COMPUTE, Platform.GKE)
    return (Platform.TPU_API, Platform.GKE)


def offers(platform: Platform | str, accelerator_type: str) -> bool:
    return Platform(platform) in offered_on(accelerator_type)


def why_not(platform: Platform | str, accelerator_type: str) -> str:
    """Why ``platform`` never offers ``accelerator_type`` (for trails and refusals); empty when it can."""
    platform = Platform(platform)
    if offers(platform, accelerator_type):
        return ""
    if kind_of(accelerator_type) == AcceleratorKind.GPU:
        return (
            f"{accelerator_type} is a GPU: GPUs are Compute Engine VMs or GKE nodes, not Cloud TPU API nodes "
            "(https://cloud.google.com/compute/docs/gpus)"
        )
    if is_tpu7x(accelerator_type):
        return f"{accelerator_type} is TPU7x (Ironwood): Google provisions it on GKE only ({TPU7X_SOURCE})"
    shapes = ", ".join(f"{s.accelerator_type} ({s.machine_type})" for s in COMPUTE_TPU_SHAPES.values())
    return (
        f"{accelerator_type} is not a Compute Engine TPU machine type; Compute Engine offers single-host {shapes} "
        f"({SOURCES[Platform.COMPUTE]})"
    )


def in_order(accelerator_type: str, allowed: Iterable[Platform | str]) -> tuple[Platform, ...]:
    """The run's platforms (its order of preference) that can offer ``accelerator_type``."""
    return tuple(p for p in (Platform(a) for a in allowed) if offers(p, accelerator_type))


def compute_tpu_shape(accelerator_type: str) -> ComputeTpuShape | None:
    return COMPUTE_TPU_SHAPES.get(accelerator_type)


def compute_tpu_for_machine_type(machine_type: str) -> ComputeTpuShape | None:
    """``ct6e-standard-4t`` -> the v6e-4 shape (a reservation names a machine type, the run a TPU type)."""
    return COMPUTE_TPU_BY_MACHINE_TYPE.get(machine_type.rstrip("/").rsplit("/", 1)[-1])


def rank(platforms: Iterable[Platform | str]) -> dict[str, int]:
    """Preference rank of each platform (0 = most preferred) for sorting places."""
    return {Platform(p).value: i for i, p in enumerate(platforms)}
