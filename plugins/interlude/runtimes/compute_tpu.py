"""Runtime check for a TPU VM created on Compute Engine: an OS image, not a TPU runtime version.

A TPU on Compute Engine is an instance of a TPU machine type (``ct6e-standard-8t``); it boots a Compute Engine
image like any VM. Google manages TPU-optimized Ubuntu images for this (project ``ubuntu-os-accelerator-images``,
family ``ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e`` for v5e, v5p and v6e;
https://cloud.google.com/tpu/docs/tpu-os-images, https://cloud.google.com/compute/docs/tpus/create-tpu-vm-instance).
A Cloud TPU API runtime version (``v2-alpha-tpuv6e``) names no Compute Engine image, and a Deep Learning VM GPU
image has no TPU driver binding: both are refused before anything is created. Another image is the user's own
and must bind the TPU chips to ``vfio-pci`` as https://cloud.google.com/tpu/docs/custom-os-image describes: a
warning. The framework is checked against the TPU generation exactly as on the TPU API (same table).
"""

from __future__ import annotations

from interlude.capacity.platforms import compute_tpu_shape
from interlude.capacity.report import AcceleratorKind
from interlude.runtimes.findings import Findings, RuntimeCheck
from interlude.runtimes.table import RuntimeTable, default_table
from interlude.runtimes.tensorflow import looks_like_tf_runtime
from interlude.runtimes.tpu import validate_tpu

CUSTOM_IMAGE_SOURCE = "https://cloud.google.com/tpu/docs/custom-os-image"
GPU_IMAGE_PREFIXES = ("common-", "pytorch-", "tf-", "tf2-")


def recommended_image(accelerator_type: str) -> str | None:
    """The image family to boot a Compute Engine TPU VM of this type with (None: not a Compute Engine TPU type)."""
    shape = compute_tpu_shape(accelerator_type)
    return shape.image_family if shape else None


def validate_compute_tpu(
    accelerator_type: str,
    image: str | None,
    framework: str | None,
    framework_version: str | None,
    python_version: str | None = None,
    table: RuntimeTable | None = None,
) -> RuntimeCheck:
    """Check ``image`` (blank = Google's TPU OS image) and the framework for a Compute Engine TPU VM of this type."""
    table = table or default_table()
    found = Findings()
    image = (image or "").strip()
    shape = compute_tpu_shape(accelerator_type)
    if shape is None:
        found.problem(
            f"{accelerator_type} is not a Compute Engine TPU machine type "
            "(https://cloud.google.com/compute/docs/tpus/tpu-machines)",
            "use platforms tpu_api or gke for it",
        )
        return found.check(accelerator_type, AcceleratorKind.TPU, image or None, framework, framework_version, None)
    # The framework against the generation: the TPU API's check with its recommended runtime, problems kept.
    tpu = validate_tpu(table, accelerator_type, "", framework, framework_version, None, python_version)
    found.problems += [p for p in tpu.problems if "runtime" not in p]
    found.warnings += list(tpu.warnings)
    chosen = image or shape.image_family
    recommended = f"use {shape.image_family} (project {shape.image_project})"
    if image and image != shape.image_family:
        _named_image(found, table, image, recommended)
    if tpu.framework == "tensorflow":
        found.warn(
            "TensorFlow's TPU builds ship as Cloud TPU API runtime versions (tpu-vm-tf-*, "
            "https://cloud.google.com/tpu/docs/runtimes); the Compute Engine image has none: the workload installs it",
            "prefer platforms tpu_api for TensorFlow",
        )
    hardware = f"{tpu.hardware} as {shape.machine_type}" if tpu.hardware else shape.machine_type
    return found.check(accelerator_type, AcceleratorKind.TPU, chosen, tpu.framework, framework_version, hardware)


def _named_image(found: Findings, table: RuntimeTable, image: str, recommended: str) -> None:
    name = image.rstrip("/").rsplit("/", 1)[-1]
    runtimes = {r for g in table.tpu_generations.values() for r in (*g.runtimes, *g.legacy_runtimes)}
    if name in runtimes or looks_like_tf_runtime(name):
        found.problem(
            f"{name} is a Cloud TPU API runtime version; a Compute Engine TPU VM boots an OS image",
            recommended,
        )
    elif name.startswith(GPU_IMAGE_PREFIXES) or "-cu1" in name:
        found.problem(f"{name} looks like a Deep Learning VM GPU image; it has no TPU support", recommended)
    else:
        found.warn(
            f"image {name} is not Google's TPU OS image: it must bind the TPU chips to vfio-pci "
            f"({CUSTOM_IMAGE_SOURCE})",
            recommended,
        )
