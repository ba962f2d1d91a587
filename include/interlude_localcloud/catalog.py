"""Static facts about machine and accelerator types (what Google's catalog would say about them)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MachineTypeInfo:
    name: str
    cpus: int
    memory_mb: int
    gpu_type: str | None
    gpu_count: int


_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 24: 2, 32: 1, 48: 4, 96: 8}
_FIXED = {
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8, 208),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8, 224),
    "a4-highgpu-8g": ("nvidia-b200", 8, 224),
}

GPU_DESCRIPTIONS = {
    "nvidia-l4": "NVIDIA L4",
    "nvidia-tesla-t4": "NVIDIA T4",
    "nvidia-tesla-a100": "NVIDIA A100 40GB",
    "nvidia-a100-80gb": "NVIDIA A100 80GB",
    "nvidia-h100-80gb": "NVIDIA H100 80GB",
    "nvidia-h100-mega-80gb": "NVIDIA H100 Mega 80GB",
    "nvidia-h200-141gb": "NVIDIA H200 141GB",
    "nvidia-b200": "NVIDIA B200",
}

# Regional Compute quota metric per GPU type: (on-demand, spot). None = not a Compute regional quota.
GPU_QUOTA_METRICS: dict[str, tuple[str | None, str | None]] = {
    "nvidia-l4": ("NVIDIA_L4_GPUS", "PREEMPTIBLE_NVIDIA_L4_GPUS"),
    "nvidia-tesla-t4": ("NVIDIA_T4_GPUS", "PREEMPTIBLE_NVIDIA_T4_GPUS"),
    "nvidia-tesla-a100": ("NVIDIA_A100_GPUS", "PREEMPTIBLE_NVIDIA_A100_GPUS"),
    "nvidia-a100-80gb": ("NVIDIA_A100_80GB_GPUS", "PREEMPTIBLE_NVIDIA_A100_80GB_GPUS"),
    "nvidia-h100-80gb": (None, "PREEMPTIBLE_NVIDIA_H100_GPUS"),
}

# TPU accelerator type prefix -> (AcceleratorConfig.type enum, quota family name).
TPU_FAMILIES = {
    "v2": "V2",
    "v3": "V3",
    "v4": "V4",
    "v5litepod": "V5LITE_POD",
    "v5p": "V5P",
    "v6e": "V6E",
}


def machine_type(name: str) -> MachineTypeInfo | None:
    """Describe a GCE machine type by name, or None when the local cloud does not know it."""
    if name in _FIXED:
        gpu, count, cpus = _FIXED[name]
        return MachineTypeInfo(name, cpus, cpus * 9 * 1024, gpu, count)
    m = re.fullmatch(r"g2-standard-(\d+)", name)
    if m and int(m[1]) in _G2_GPUS:
        n = int(m[1])
        return MachineTypeInfo(name, n, n * 4 * 1024, "nvidia-l4", _G2_GPUS[n])
    m = re.fullmatch(r"a3-highgpu-(\d)g", name)
    if m and int(m[1]) in (1, 2, 4, 8):
        n = int(m[1])
        return MachineTypeInfo(name, 26 * n, 234 * 1024 * n, "nvidia-h100-80gb", n)
    m = re.fullmatch(r"a2-(highgpu|ultragpu|megagpu)-(\d+)g", name)
    if m:
        n = int(m[2])
        gpu = "nvidia-a100-80gb" if m[1] == "ultragpu" else "nvidia-tesla-a100"
        return MachineTypeInfo(name, 12 * n, 85 * 1024 * n, gpu, n)
    m = re.fullmatch(r"(n1|n2|e2)-(standard|highmem|highcpu)-(\d+)", name)
    if m:
        n = int(m[3])
        per = {"standard": 3840, "highmem": 6656, "highcpu": 922}[m[2]]
        return MachineTypeInfo(name, n, n * per, None, 0)
    return None


def tpu_family(accelerator_type: str) -> tuple[str, int]:
    """("v6e-8") -> ("v6e", 8); raises ValueError for names that are not TPU types."""
    m = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type)
    if not m or m[1] not in TPU_FAMILIES:
        raise ValueError(accelerator_type)
    return m[1], int(m[2])


@dataclass(frozen=True)
class TpuShape:
    """A TPU accelerator type as Google's tables describe it: chips, hosts (TPU VMs, the node's workers),
    chips per host and the topology the API shows in acceleratorConfig."""

    family: str
    chips: int
    hosts: int
    topology: str

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1


# Topologies by chip count, from Google's configuration tables: v5e and v6e (2D torus; v5litepod-N and v6e-N
# count chips; up to 8 chips on one host, 4-chip hosts beyond: https://cloud.google.com/tpu/docs/v5e,
# https://cloud.google.com/tpu/docs/v6e), v5p and v4 (3D; -N counts TensorCores, 2 per chip, 4 chips per
# host: https://cloud.google.com/tpu/docs/v5p, https://cloud.google.com/tpu/docs/v4), v2/v3 (4 chips and
# 8 TensorCores per host: https://cloud.google.com/tpu/docs/system-architecture-tpu-vm).
_TOPOLOGY_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TOPOLOGY_3D = {
    4: "2x2x1",
    8: "2x2x2",
    16: "2x2x4",
    32: "2x4x4",
    64: "4x4x4",
    128: "4x4x8",
    256: "4x8x8",
    512: "8x8x8",
    1024: "8x8x16",
    2048: "8x16x16",
    4096: "16x16x16",
}
_TOPOLOGY_V2_V3 = {4: "2x2", 16: "4x4", 64: "8x8", 128: "8x16", 256: "16x16", 512: "16x32", 1024: "32x32"}


def tpu_shape(accelerator_type: str) -> TpuShape:
    """("v5litepod-16") -> 16 chips on 4 hosts, "4x4"; ("v5p-16") -> 8 chips on 2 hosts, "2x2x2".
    Raises ValueError for names that are not TPU types."""
    family, size = tpu_family(accelerator_type)
    if family in ("v5litepod", "v6e"):
        chips = size
        hosts = 1 if chips <= 8 else chips // 4
        topology = _TOPOLOGY_2D.get(chips, f"{chips}x1")
    else:
        chips = max(1, size // 2)
        hosts = max(1, chips // 4)
        table = _TOPOLOGY_3D if family in ("v4", "v5p") else _TOPOLOGY_V2_V3
        topology = table.get(chips, f"{chips}x1")
    return TpuShape(family, chips, hosts, topology)


# What runtimeVersions.list shows in a zone offering a TPU family: Google's own names
# (https://cloud.google.com/tpu/docs/runtimes). TensorFlow runtimes carry -pod for slices, -pjrt/-se from
# TF 2.15, and on recent releases a hardware suffix (v5e-and-v6, v5p-and-below); TPU v4 used -v4 names up
# to TF 2.10.0.
_TF_V5E_V6E = [
    "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6",
    "tpu-vm-tf-2.18.0-pod-pjrt-v5e-and-v6",
    "tpu-vm-tf-2.17.1-pjrt",
    "tpu-vm-tf-2.17.1-pod-pjrt",
    "tpu-vm-tf-2.16.2-pjrt",
    "tpu-vm-tf-2.16.2-pod-pjrt",
    "tpu-vm-tf-2.16.1-pjrt",
    "tpu-vm-tf-2.16.1-pod-pjrt",
    "tpu-vm-tf-2.15.1-pjrt",
    "tpu-vm-tf-2.15.1-pod-pjrt",
]
_TF_V5P_AND_BELOW = [
    "tpu-vm-tf-2.18.0-pjrt-v5p-and-below",
    "tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below",
    "tpu-vm-tf-2.17.1-pjrt",
    "tpu-vm-tf-2.17.1-pod-pjrt",
    "tpu-vm-tf-2.16.2-pjrt",
    "tpu-vm-tf-2.16.2-pod-pjrt",
    "tpu-vm-tf-2.16.1-pjrt",
    "tpu-vm-tf-2.16.1-pod-pjrt",
    "tpu-vm-tf-2.15.1-pjrt",
    "tpu-vm-tf-2.15.1-pod-pjrt",
]
_TF_V2_V4 = [
    "tpu-vm-tf-2.16.1-se",
    "tpu-vm-tf-2.15.1-se",
    "tpu-vm-tf-2.14.1",
    "tpu-vm-tf-2.14.1-pod",
    "tpu-vm-tf-2.13.1",
    "tpu-vm-tf-2.12.1",
    "tpu-vm-tf-2.10.1",
]
TPU_RUNTIME_VERSIONS: dict[str, list[str]] = {
    "v6e": ["v2-alpha-tpuv6e", *_TF_V5E_V6E],
    "v5litepod": ["v2-alpha-tpuv5-lite", *_TF_V5E_V6E],
    "v5p": ["v2-alpha-tpuv5", *_TF_V5P_AND_BELOW],
    "v4": [
        "tpu-ubuntu2204-base",
        "tpu-vm-v4-base",
        "tpu-vm-v4-pt-2.0",
        *_TF_V5P_AND_BELOW,
        *_TF_V2_V4,
        "tpu-vm-tf-2.10.0-v4",
        "tpu-vm-tf-2.10.0-pod-v4",
    ],
    "v3": ["tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-pt-2.0", *_TF_V5P_AND_BELOW, *_TF_V2_V4],
    "v2": ["tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-pt-2.0", *_TF_V5P_AND_BELOW, *_TF_V2_V4],
}


def runtime_versions_for(accelerator_types: list[str]) -> list[str]:
    """The runtime versions a zone offering these TPU types lists (Google's names, no duplicates)."""
    out: list[str] = []
    for accel in accelerator_types:
        family, _ = tpu_family(accel)
        out += [v for v in TPU_RUNTIME_VERSIONS.get(family, []) if v not in out]
    return out
