"""TPU machine types of Compute Engine: TPU VMs as instances of the accelerator-optimized machine family.

Google documents v5p, v6e and TPU7x as Compute Engine machine types
(https://cloud.google.com/compute/docs/tpus/tpu-machines): an instance of `ct6e-standard-4t` is a TPU VM with
4 v6e chips attached, created with `instances.insert` like any VM. The TPU API's pages say Ironwood (TPU7x) is
not served there (https://cloud.google.com/tpu/docs/tpu7x), so Compute Engine (and GKE) is the only way to it.

Kept apart from catalog.py (the TPU API's families): this is the Compute Engine side.
"""

from __future__ import annotations

from dataclasses import dataclass

from interlude_localcloud.catalog import MachineTypeInfo, machine_type


@dataclass(frozen=True)
class TpuMachineType:
    """One TPU machine type: its chips, host shape and what the guest sees (accelerator-type metadata)."""

    name: str
    family: str  # v5p | v6e | tpu7x
    chips: int
    cpus: int
    memory_gb: int
    accelerator: str  # machineTypes.accelerators[].guestAcceleratorType; also the scenario's capacity key (chips)
    accelerator_type: str  # the TPU VM's `accelerator-type` metadata (TPU API naming: v6e-4, v5p-8, tpu7x-8)
    topology: str

    @property
    def info(self) -> MachineTypeInfo:
        """As catalog.machine_type describes a GPU machine type: the TPU chips are its built-in accelerators."""
        return MachineTypeInfo(self.name, self.cpus, self.memory_gb * 1024, self.accelerator, self.chips)


# vCPUs and memory per VM: https://cloud.google.com/tpu/docs/v6e (1-chip 44 vCPUs/176 GB, 4-chip 180/720,
# 8-chip 180/1440), https://cloud.google.com/tpu/docs/tpu7x (4-chip VMs: v5p 208/448, TPU7x 224/960).
# v5p and TPU7x count TensorCores in TPU API names (2 per chip): 4 chips = v5p-8 / tpu7x-8. The accelerator
# names are the ones GKE labels TPU nodes of these machine types with (cloud.google.com/gke-tpu-accelerator).
TPU_MACHINE_TYPES: dict[str, TpuMachineType] = {
    t.name: t
    for t in (
        TpuMachineType("ct5p-hightpu-4t", "v5p", 4, 208, 448, "tpu-v5p-slice", "v5p-8", "2x2x1"),
        TpuMachineType("ct6e-standard-1t", "v6e", 1, 44, 176, "tpu-v6e-slice", "v6e-1", "1x1"),
        TpuMachineType("ct6e-standard-4t", "v6e", 4, 180, 720, "tpu-v6e-slice", "v6e-4", "2x2"),
        TpuMachineType("ct6e-standard-8t", "v6e", 8, 180, 1440, "tpu-v6e-slice", "v6e-8", "2x4"),
        TpuMachineType("tpu7x-standard-4t", "tpu7x", 4, 224, 960, "tpu7x", "tpu7x-8", "2x2x1"),
    )
}
TPU_ACCELERATORS = {t.accelerator for t in TPU_MACHINE_TYPES.values()}
TPU_DESCRIPTIONS = {"tpu-v5p-slice": "TPU v5p", "tpu-v6e-slice": "TPU v6e", "tpu7x": "TPU7x (Ironwood)"}

# Regional quota in TPU chips per family, (on-demand, spot). Google keeps TPU VM quotas in Cloud Quotas: Compute's
# regions.get lists no v5p/v6e/TPU7x metric (its Quota.metric enum has only TPU v4/v5e ones). The local cloud
# enforces these at insert (403 quotaExceeded, Compute's wording) when the scenario's region sets them, and, like
# Google, leaves them out of regions.get. The names are the local cloud's.
TPU_QUOTA_METRICS: dict[str, tuple[str, str]] = {
    "tpu-v5p-slice": ("TPU_V5P_CHIPS", "PREEMPTIBLE_TPU_V5P_CHIPS"),
    "tpu-v6e-slice": ("TPU_V6E_CHIPS", "PREEMPTIBLE_TPU_V6E_CHIPS"),
    "tpu7x": ("TPU7X_CHIPS", "PREEMPTIBLE_TPU7X_CHIPS"),
}


def tpu_machine_type(name: str) -> TpuMachineType | None:
    return TPU_MACHINE_TYPES.get(name)


def machine_info(name: str) -> MachineTypeInfo | None:
    """Any Compute Engine machine type the local cloud knows: a TPU one, else catalog.machine_type's."""
    tpu = TPU_MACHINE_TYPES.get(name)
    return tpu.info if tpu is not None else machine_type(name)


def tpu_env(t: TpuMachineType) -> str:
    """The `tpu-env` metadata attribute of a single-host TPU VM (`KEY: 'value'` lines, as Google's)."""
    values = {
        "ACCELERATOR_TYPE": t.accelerator_type,
        "CHIPS_PER_HOST_BOUNDS": t.topology.replace("x", ",") + (",1" if t.topology.count("x") == 1 else ""),
        "HOST_BOUNDS": "1,1,1",
        "TOPOLOGY": t.topology,
        "WORKER_ID": "0",
    }
    return "".join(f"{k}: '{v}'\n" for k, v in values.items())


def guest_attributes(t: TpuMachineType) -> dict[str, str]:
    """Metadata attributes a TPU VM's guest reads that the instance's API `metadata.items` does not carry."""
    return {"accelerator-type": t.accelerator_type, "tpu-env": tpu_env(t)}
