"""The two Google surfaces a machine lives on, made together: Cloud TPU (nodes, queued resources) and Compute
Engine (GPU VMs, and TPU VMs of the generations the TPU API does not serve).

Why one factory: provisioning, teardown, the stage operator and the training tasks each need both hooks for one
Airflow connection; this is the one place that makes them (typed, not a ``tuple[Any, Any]`` per module).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from interlude.hooks.compute import ComputeHook
    from interlude.hooks.tpu import TpuHook


class MachineHooks(NamedTuple):
    tpu: TpuHook
    compute: ComputeHook


def machine_hooks(gcp_conn_id: str | None) -> MachineHooks:
    """Both hooks for one connection (``None``: the environment's credentials, as the local cloud's tests use).

    The hook modules are imported here, not at the top: DAG files import the modules that call this, and the
    Google clients behind the hooks load only when a task runs."""
    from interlude.hooks.compute import ComputeHook
    from interlude.hooks.tpu import TpuHook

    return MachineHooks(TpuHook(gcp_conn_id=gcp_conn_id), ComputeHook(gcp_conn_id=gcp_conn_id))
