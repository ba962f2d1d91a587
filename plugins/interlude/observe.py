"""Turn what Google and GCS show into one `Observation` for the stage state machine.

Kept apart from the trigger so the sync (non-deferrable) path and the trigger read the world the
same way, and so the folding of Google's many states into READY / DOWN / GONE is tested on its own.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from interlude.maintenance import Machine, Notice, Observation

# TPU node states (names; the hooks return enum names) that mean "will not come back by itself".
_TPU_GONE = {"PREEMPTED", "DELETING", "HIDDEN", "HIDING"}
_GCE_UP = {"RUNNING"}


def _notice(raw: dict[str, Any] | None) -> Notice | None:
    if not raw:
        return None
    return Notice(kind=str(raw.get("type", "UNKNOWN_TYPE")), status=str(raw.get("maintenanceStatus", "PENDING")),
                  window_start=raw.get("windowStartTime"))


def tpu_machine(node: dict[str, Any] | None) -> tuple[Machine, Notice | None]:
    """READY only when the node is READY, healthy and no maintenance is running on it."""
    if node is None:
        return Machine.GONE, None
    notice = _notice(node.get("upcomingMaintenance"))
    state = node.get("state")
    if state in _TPU_GONE:
        return Machine.GONE, notice
    healthy = node.get("health") in (None, "HEALTHY", "HEALTH_UNSPECIFIED")
    ongoing = notice is not None and notice.status == "ONGOING"
    if state == "READY" and healthy and not ongoing:
        return Machine.READY, notice
    return Machine.DOWN, notice


def gce_machine(instance: dict[str, Any] | None) -> tuple[Machine, Notice | None]:
    """A spot VM, or one without automaticRestart, stays TERMINATED: only re-provisioning helps."""
    if instance is None:
        return Machine.GONE, None
    notice = _notice((instance.get("resourceStatus") or {}).get("upcomingMaintenance"))
    status = instance.get("status")
    scheduling = instance.get("scheduling") or {}
    if status in _GCE_UP and not (notice and notice.status == "ONGOING"):
        return Machine.READY, notice
    restarts = scheduling.get("automaticRestart", True) and scheduling.get("provisioningModel") != "SPOT"
    if status == "TERMINATED" and not restarts:
        return Machine.GONE, notice
    return Machine.DOWN, notice


def machine_view(kind: str, resource: dict[str, Any] | None) -> tuple[Machine, Notice | None]:
    return gce_machine(resource) if kind == "gce_vm" else tpu_machine(resource)


@dataclass(frozen=True)
class StageFacts:
    """What GCS says about a stage: read in one place so trigger and sync loop agree."""

    committed_step: int
    progress: dict[str, Any]
    request_ack_step: int | None


_CLIENT: Any = None
_CLIENT_LOCK = threading.Lock()


def _shared_client() -> Any:
    """One storage client per process: a new one per poll costs a thread, a connection and a call."""
    global _CLIENT
    with _CLIENT_LOCK:
        if _CLIENT is None:
            from interlude_workload.gcs import storage_client

            _CLIENT = storage_client()
        return _CLIENT


def read_stage_facts(bucket: str, run_key: str, stage: str, request_id: str | None) -> StageFacts:
    """Blocking GCS reads; triggers call this through asyncio.to_thread."""
    from interlude_workload.checkpoints import CheckpointStore

    store = CheckpointStore(bucket, run_key, stage, client=_shared_client())
    latest = store.latest()
    committed = latest.checkpoint.step if latest.checkpoint else 0
    progress = store.read_progress() or {}
    ack = store.checkpoint_for_request(request_id) if request_id else None
    return StageFacts(committed, progress, ack)


def observation(kind: str, resource: dict[str, Any] | None, facts: StageFacts,
                now: float | None = None) -> Observation:
    machine, notice = machine_view(kind, resource)
    progress = facts.progress
    resumed = progress.get("resumed_from")
    return Observation(
        now=time.time() if now is None else now,
        machine=machine,
        notice=notice,
        committed_step=facts.committed_step,
        progress_step=int(progress.get("step") or 0),
        resumed_from=int(resumed) if resumed is not None else None,
        boot_id=progress.get("boot_id"),
        request_ack_step=facts.request_ack_step,
        workload_error=str(progress.get("error")) if progress.get("state") == "failed" else None,
    )


def progress_line(stage: str, progress: dict[str, Any]) -> str:
    """One human line for the task log: step x/y, loss, rate, ETA."""
    if not progress:
        return f"[{stage}] waiting for the workload to report progress"
    step, total = progress.get("step", 0), progress.get("total_steps") or progress.get("steps") or "?"
    loss = progress.get("loss")
    rate = progress.get("steps_per_second") or progress.get("rate")
    eta = progress.get("eta_seconds") or progress.get("eta_s")
    parts = [f"[{stage}] step {step}/{total}"]
    if loss is not None:
        parts.append(f"loss {float(loss):.5f}")
    if rate:
        parts.append(f"{float(rate):.2f} steps/s")
    if eta is not None:
        parts.append(f"ETA {float(eta):.0f}s")
    if progress.get("state"):
        parts.append(str(progress["state"]))
    return "  ".join(parts)
