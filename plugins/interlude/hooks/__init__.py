"""Hooks for Google's Cloud TPU and Compute Engine APIs (and the local cloud that imitates them).

Import from the modules: ``interlude.hooks.tpu`` (TpuHook, AsyncTpuHook), ``interlude.hooks.compute``
(ComputeHook, AsyncComputeHook), ``interlude.hooks.errors`` (the exception classes). Nothing is imported
here so that ``import interlude.hooks.errors`` stays cheap for callers that only need the exceptions. The
triggerer imports the async hooks from ``interlude.hooks.tpu_async`` / ``interlude.hooks.compute_async``:
those modules load neither Google's client libraries nor the provider's ``GoogleBaseHook``.
"""
