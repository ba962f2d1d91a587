"""The entry point: :func:`validate` an accelerator type x runtime x framework before provisioning.

A wrong TPU runtime fails the launch or quietly runs slowly; a GPU image with too old a driver or CUDA
does not run the workload at all. Both cost a provisioning round trip, so the pipeline checks first and
explains every mismatch with what would work instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from interlude.capacity.report import AcceleratorKind, kind_of
from interlude.runtimes.compute_tpu import validate_compute_tpu
from interlude.runtimes.findings import Findings, RuntimeCheck
from interlude.runtimes.gpu import validate_gpu
from interlude.runtimes.table import RuntimeTable, default_table
from interlude.runtimes.tpu import validate_tpu


def validate(
    accelerator_type: str,
    runtime: str | None = "",
    framework: str | None = "",
    framework_version: str | None = None,
    offered_runtime_versions: Sequence[str] | None = None,
    *,
    python_version: str | None = None,
    table: RuntimeTable | None = None,
    platform: str | None = None,
) -> RuntimeCheck:
    """Check that ``runtime`` (TPU runtime version, or GPU image family; blank = the recommended one)
    and ``framework`` at ``framework_version`` fit ``accelerator_type``.

    ``offered_runtime_versions`` is what the zone offers (``TpuHook.list_runtime_versions``, or image
    families for GPUs) and is the authority on which names exist; None skips that check and falls back
    on Google's published names in the table. ``python_version`` is the interpreter the workload uses
    (None = the runtime's system Python). ``platform`` ``compute`` checks a TPU type as a Compute Engine TPU VM:
    ``runtime`` is then its OS image (:mod:`interlude.runtimes.compute_tpu`). Never raises for unknown names:
    they are problems.
    """
    table = table or default_table()
    accelerator_type = (accelerator_type or "").strip()
    runtime = (runtime or "").strip()
    framework = (framework or "").strip().lower() or None
    framework_version = (framework_version or "").strip() or None
    if not accelerator_type:
        found = Findings()
        found.problem("no accelerator type given", "pass a TPU type such as v6e-8 or a GPU type such as nvidia-l4")
        return found.check("", None, runtime or None, framework, framework_version, None)
    if platform == "compute" and kind_of(accelerator_type) == AcceleratorKind.TPU:
        return validate_compute_tpu(accelerator_type, runtime, framework, framework_version, python_version, table)
    check = validate_gpu if kind_of(accelerator_type) == AcceleratorKind.GPU else validate_tpu
    return check(
        table, accelerator_type, runtime, framework, framework_version, offered_runtime_versions, python_version
    )
