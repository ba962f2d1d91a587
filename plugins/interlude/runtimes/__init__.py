"""Accelerator software compatibility: which TPU runtime / GPU image fits which hardware and framework.

Split by concern: ``table`` (the data file as typed objects), ``tensorflow`` (Google's ``tpu-vm-tf-*``
names), ``tpu`` and ``gpu`` (the rules per kind), ``findings`` (the result), ``check`` (:func:`validate`).
The facts live in ``plugins/interlude/runtimes/runtimes.yaml``; the zone's live runtime list is the authority on names.
"""

from interlude.runtimes.check import validate
from interlude.runtimes.findings import RuntimeCheck
from interlude.runtimes.gpu import gpu_type, image_cuda_driver, recommended_gpu_image
from interlude.runtimes.table import (
    DEFAULT_TABLE_PATH,
    TABLE_ENV,
    FrameworkRange,
    GpuType,
    RuntimeTable,
    RuntimeTableError,
    TensorflowReleases,
    TensorflowRules,
    TpuGeneration,
    default_table,
)
from interlude.runtimes.tensorflow import TfRuntime, parse_tf_runtime
from interlude.runtimes.tpu import TpuType, UnknownAcceleratorError, parse_tpu_type, recommended_runtime


class UnknownFrameworkError(ValueError):
    """A framework name the table does not know for that accelerator family (kept for callers)."""


__all__ = [
    "DEFAULT_TABLE_PATH",
    "TABLE_ENV",
    "FrameworkRange",
    "GpuType",
    "RuntimeCheck",
    "RuntimeTable",
    "RuntimeTableError",
    "TensorflowReleases",
    "TensorflowRules",
    "TfRuntime",
    "TpuGeneration",
    "TpuType",
    "UnknownAcceleratorError",
    "UnknownFrameworkError",
    "default_table",
    "gpu_type",
    "image_cuda_driver",
    "parse_tf_runtime",
    "parse_tpu_type",
    "recommended_gpu_image",
    "recommended_runtime",
    "validate",
]
