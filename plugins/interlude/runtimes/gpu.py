"""GPU side of the check: Deep Learning VM image families, the CUDA and driver they promise, and frameworks.

Sources: GPU machine types (https://cloud.google.com/compute/docs/gpus), Deep Learning VM images
(https://cloud.google.com/deep-learning-vm/docs/images), NVIDIA's CUDA release notes for driver floors.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from packaging.version import Version

from interlude.capacity.report import AcceleratorKind
from interlude.runtimes.findings import Findings, RuntimeCheck, note_warning, python_problems, version_problems
from interlude.runtimes.table import GpuType, RuntimeTable, default_table
from interlude.runtimes.tpu import UnknownAcceleratorError, is_tpu_runtime

_IMAGE_CUDA = re.compile(r"(?:^|[-_])cu(?P<major>1\d)(?P<minor>\d)(?:$|[-_])")
_IMAGE_DRIVER = re.compile(r"nvidia-(?P<driver>\d{3})(?:$|[-_])")


def gpu_type(accelerator_type: str, table: RuntimeTable | None = None) -> GpuType:
    table = table or default_table()
    try:
        return table.gpu_types[accelerator_type]
    except KeyError:
        raise UnknownAcceleratorError(
            f"unknown GPU type {accelerator_type!r}; known: {', '.join(table.gpu_types)}"
        ) from None


def recommended_gpu_image(accelerator_type: str, table: RuntimeTable | None = None) -> str:
    """The Deep Learning VM image family to boot a GPU VM of that type with."""
    return gpu_type(accelerator_type, table).recommended_image


def image_cuda_driver(image: str, table: RuntimeTable | None = None) -> tuple[str | None, int | None]:
    """CUDA version and driver branch a Deep Learning VM image family name promises.

    ``common-cu128-ubuntu-2204-nvidia-570`` -> ("12.8", 570). Without an ``nvidia-NNN`` part the driver
    is the least that CUDA version needs. (None, None) when the name says nothing.
    """
    table = table or default_table()
    name = image.rstrip("/").rsplit("/", 1)[-1]
    m = _IMAGE_CUDA.search(name)
    cuda = f"{m.group('major')}.{m.group('minor')}" if m else None
    d = _IMAGE_DRIVER.search(name)
    driver = int(d.group("driver")) if d else None
    if driver is None and cuda is not None:
        known = [k for k in table.cuda_min_driver if Version(k) <= Version(cuda)]
        if known:
            driver = table.cuda_min_driver[max(known, key=Version)]
    return cuda, driver


def _framework(
    found: Findings,
    table: RuntimeTable,
    gpu: GpuType,
    framework: str | None,
    framework_version: str | None,
    python_version: str | None,
) -> str | None:
    if framework is None:
        return None
    aliased = table.gpu_aliases.get(framework, framework)
    if aliased != framework:
        found.warn(f"framework {framework!r} on GPU means {aliased!r}")
    if aliased in table.gpu_tpu_only_frameworks:
        instead = table.gpu_tpu_only_frameworks[aliased]
        found.problem(f"{aliased} runs on TPUs only; on GPUs use {instead}", f"use {instead}")
        return aliased
    if aliased not in table.gpu_frameworks:
        found.problem(
            f"unknown framework {aliased!r} for GPU; known: {', '.join(table.gpu_frameworks)}",
            "pick one of: " + ", ".join(table.gpu_frameworks),
        )
        return aliased
    rng = table.gpu_frameworks[aliased]
    version_problems(found, rng, framework_version, f"{gpu.label} ({gpu.architecture})", gpu.architecture)
    python_problems(found, rng, python_version, None)
    note_warning(found, rng)
    if rng.min_compute_capability and Version(gpu.compute_capability) < Version(rng.min_compute_capability):
        found.problem(
            f"{aliased} needs compute capability >= {rng.min_compute_capability}; "
            f"{gpu.label} has {gpu.compute_capability}",
            "use a newer GPU type",
        )
    return aliased


def _image(found: Findings, table: RuntimeTable, gpu: GpuType, chosen: str, framework: str | None) -> None:
    """The CUDA and driver the image promises against what the GPU and framework need."""
    cuda, driver = image_cuda_driver(chosen, table)
    # the two floors have different reasons: CUDA builds for the compute capability from a version on; the
    # GPU itself runs on NVIDIA's drivers from a branch on (H200: R550, whatever the CUDA)
    need_cuda = f"compute capability {gpu.compute_capability} ({gpu.architecture}) builds from CUDA {gpu.min_cuda}"
    need_driver = f"{gpu.label} is supported by NVIDIA drivers from {gpu.min_driver}"
    if cuda is None:
        found.warn(
            f"cannot tell the CUDA version of image {chosen} from its name; {need_cuda}; {need_driver}",
            f"or use {gpu.recommended_image}",
        )
        return
    if Version(cuda) < Version(gpu.min_cuda):
        found.problem(f"image {chosen} ships CUDA {cuda}; {need_cuda}", f"use {gpu.recommended_image}")
    elif driver is not None and driver < gpu.min_driver:
        found.problem(f"image {chosen} ships driver {driver}; {need_driver}", f"use {gpu.recommended_image}")
    rng = table.gpu_frameworks.get(framework or "")
    arch_cuda = rng.min_cuda_by_architecture.get(gpu.architecture) if rng else None
    if arch_cuda and Version(cuda) < Version(arch_cuda):
        found.problem(
            f"{framework} on {gpu.architecture} needs CUDA >= {arch_cuda}; image {chosen} ships {cuda}",
            f"use {gpu.recommended_image}",
        )


def validate_gpu(
    table: RuntimeTable,
    accelerator_type: str,
    image: str,
    framework: str | None,
    framework_version: str | None,
    offered: Sequence[str] | None,
    python_version: str | None,
) -> RuntimeCheck:
    found = Findings()
    try:
        gpu = gpu_type(accelerator_type, table)
    except UnknownAcceleratorError as exc:
        found.problem(str(exc), "use one of: " + ", ".join(table.gpu_types))
        return found.check(accelerator_type, AcceleratorKind.GPU, image or None, framework, framework_version, None)
    hardware = f"{gpu.label}, {gpu.architecture}"
    framework = _framework(found, table, gpu, framework, framework_version, python_version)
    chosen = image or gpu.recommended_image
    if not image and offered is not None and chosen not in offered:
        found.problem(
            f"recommended image {chosen} is not offered (offered: {', '.join(offered) or 'none'})",
            "pick an offered image with a new enough driver",
        )
    if is_tpu_runtime(table, chosen):
        found.problem(
            f"{chosen} is a TPU runtime version; a GPU VM boots an image; use {gpu.recommended_image}",
            f"use {gpu.recommended_image}",
        )
        return found.check(accelerator_type, AcceleratorKind.GPU, chosen, framework, framework_version, hardware)
    _image(found, table, gpu, chosen, framework)
    if image and offered is not None and image not in offered:
        found.problem(
            f"image {image} is not offered (offered: {', '.join(offered) or 'none'})", f"use {gpu.recommended_image}"
        )
    return found.check(accelerator_type, AcceleratorKind.GPU, chosen, framework, framework_version, hardware)
