"""Turn what Google and GCS show into one `Observation` for the stage state machine.

Kept apart from the trigger so the sync (non-deferrable) path and the trigger read the world the
same way, and so the folding of Google's many states into READY / DOWN / GONE is tested on its own.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from interlude.stage.model import Machine, Notice, Observation
from interlude.stage.notice_policy import MachineState, machine_gone

_GCE_UP = {"RUNNING"}


def _notice(raw: dict[str, Any] | None) -> Notice | None:
    return Notice.from_upcoming(raw) if raw else None


def tpu_machine(node: dict[str, Any] | None) -> tuple[Machine, Notice | None]:
    """READY only when the node is READY, healthy and no maintenance is running on it."""
    if node is None:
        return Machine.GONE, None
    notice = _notice(node.get("upcomingMaintenance"))
    state = node.get("state")
    if machine_gone(tpu_state(node)):
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
    if status in _GCE_UP and not (notice and notice.status == "ONGOING"):
        return Machine.READY, notice
    if machine_gone(gce_state(instance)):
        return Machine.GONE, notice
    return Machine.DOWN, notice


def tpu_state(node: dict[str, Any] | None) -> MachineState:
    """What the TPU API says about a node, as the maintenance policy reads it (nodes restart by themselves)."""
    return MachineState(exists=node is not None, state=str((node or {}).get("state") or ""))


def gce_state(instance: dict[str, Any] | None) -> MachineState:
    """What the Compute API says about a VM: a Spot VM, or one with ``automaticRestart`` false, stays
    TERMINATED (https://cloud.google.com/compute/docs/instances/setting-vm-host-options)."""
    scheduling = (instance or {}).get("scheduling") or {}
    restarts = bool(scheduling.get("automaticRestart", True)) and scheduling.get("provisioningModel") != "SPOT"
    return MachineState(
        exists=instance is not None, state=str((instance or {}).get("status") or ""), automatic_restart=restarts
    )


WATCH_FIELDS: dict[str, tuple[str, ...]] = {
    "tpu_node": ("name", "state", "health", "upcomingMaintenance"),
    "gce_vm": ("name", "status", "resourceStatus", "scheduling"),
}
"""The top-level fields of a TPU node or Compute instance that machine_view, tpu_state and gce_state read."""
MACHINE_FIELDS = frozenset(WATCH_FIELDS["tpu_node"] + WATCH_FIELDS["gce_vm"])


@functools.cache
def list_fields(kind: str) -> str:
    """The ``fields`` a watcher's zone list asks for (a partial response,
    https://cloud.google.com/compute/docs/api/how-tos/performance): the fields it reads and the page token. A
    TPU node as listed is ~600 bytes of JSON and ~2 KB of Python objects; these fields ~120 bytes. The list is
    fetched every poll interval for a whole zone, and parsing and holding the rest was most of its cost."""
    items = "items" if kind == "gce_vm" else "nodes"
    return f"{items}({','.join(WATCH_FIELDS[kind])}),nextPageToken"


def watched_fields(resource: dict[str, Any]) -> dict[str, Any]:
    """The resource with only the fields a watcher reads (see MACHINE_FIELDS)."""
    return {k: v for k, v in resource.items() if k in MACHINE_FIELDS}


def machine_view(kind: str, resource: dict[str, Any] | None) -> tuple[Machine, Notice | None]:
    return gce_machine(resource) if kind == "gce_vm" else tpu_machine(resource)


@dataclass(frozen=True)
class StageFacts:
    """What GCS says about a stage: read in one place so trigger and sync loop agree."""

    committed_step: int
    progress: dict[str, Any]
    request_ack_step: int | None
    request_ack_at: float | None = None  # when the workload answered the request (its own clock)
    export_committed: bool = False  # the stage's Hugging Face export marker is in GCS (hf_export.STAGE_MARKER)


Ack = tuple[int | None, float | None]
NO_ACK: Ack = (None, None)


def ack_of(ack: dict[str, Any] | None) -> Ack:
    """(step, when answered) of a control request's ack as the workload wrote it (``CheckpointStore.acknowledge``:
    ``committed_at`` is its clock when the answer was written, after the commit); NO_ACK when there is none."""
    if not ack or "step" not in ack:
        return NO_ACK
    try:
        at = dt.datetime.fromisoformat(str(ack.get("committed_at")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        at = None
    return int(ack["step"]), at


_CLIENTS: dict[str | None, Any] = {}
_CLIENT_LOCK = threading.Lock()


def _shared_client() -> Any:
    """One storage client per process and endpoint: a new one per poll costs a thread, a connection and a call.

    Keyed by the emulator endpoint the environment names (None: Google's), so a process that is pointed at
    another endpoint (a triggerer's tests, a tool switching local clouds) never reads the old one's buckets.
    """
    from interlude_workload.gcs import EMULATOR_ENV, storage_client

    endpoint = os.environ.get(EMULATOR_ENV) or None
    with _CLIENT_LOCK:
        client = _CLIENTS.get(endpoint)
        if client is None:
            client = _CLIENTS[endpoint] = storage_client()
        return client


def read_stage_facts(
    bucket: str, run_key: str, stage: str, request_id: str | None, final_step: int | None = None
) -> StageFacts:
    """Blocking GCS reads; triggers call this through asyncio.to_thread. ``final_step``: the stage's last step, for
    a stage that exports (whether its export is in is asked once that step is committed)."""
    from interlude_workload.checkpoints import CheckpointStore

    store = CheckpointStore(bucket, run_key, stage, client=_shared_client())
    latest = store.latest()
    committed = latest.checkpoint.step if latest.checkpoint else 0
    progress = store.read_progress() or {}
    step, answered_at = ack_of(store._get_json(f"control/ack-{request_id}.json")) if request_id else NO_ACK
    return StageFacts(committed, progress, step, answered_at, _export_listed(store, final_step, committed))


def _export_listed(store: Any, final_step: int | None, committed: int) -> bool:
    """Whether the export's marker is in GCS; asked (one GET) only once the final step is committed."""
    from interlude_workload import hf_export

    if final_step is None or committed < final_step:
        return False
    return bool(store.bucket.blob(store.base + hf_export.STAGE_MARKER).exists())


def _epoch(value: Any) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


_BEGIN = re.compile(r"startup: begin: boot (\S+)")
_END = re.compile(r"startup: end \(exit (\d+)\) boot (\S+)")
_GOOGLE_END = re.compile(r"startup-script exit status (\d+)")


@dataclass(frozen=True)
class StartupFailure:
    """The startup script ended on the machine's latest boot: nothing runs the workload any more."""

    boot: str  # the boot it ended on (from its "begin" line)
    exit_code: int
    tail: str  # its last lines, for the task log and the failure message

    def summary(self) -> str:
        return f"exit {self.exit_code}: " + " | ".join(self.tail.splitlines()[-3:])


def startup_failure(serial: str, tail_lines: int = 12) -> StartupFailure | None:
    """Read the serial console: did the startup script of the latest boot end (and not by SIGTERM)?

    The script prints ``startup: begin: boot ID`` first and ``startup: end (exit N) boot ID`` last (see
    interlude_workload.startup); Google's script runner adds ``startup-script exit status N``
    (https://cloud.google.com/compute/docs/instances/startup-scripts/linux#viewing-output). The agent
    only ends on SIGTERM, when the machine goes down; the previous boot's last words may arrive after
    the new boot's first ones, hence the boot id on both lines.
    """
    begins = list(_BEGIN.finditer(serial))
    if not begins:
        return None
    last = begins[-1]
    boot = last.group(1)
    # A new boot starts while the old one's last lines are still being written: match ends to their boot.
    ends = [m for m in _END.finditer(serial) if m.group(2) == boot]
    code: int | None = int(ends[-1].group(1)) if ends else None
    if code is None:
        google = _GOOGLE_END.search(serial, last.end())
        if google is None or "SIGTERM" in serial[last.end() : google.start()]:
            return None
        code = int(google.group(1))
    lines = [ln for ln in serial[last.start() :].splitlines() if ln.strip()]
    return StartupFailure(boot=boot, exit_code=code, tail="\n".join(lines[-tail_lines:]))


def observation(
    kind: str,
    resource: dict[str, Any] | None,
    facts: StageFacts,
    now: float | None = None,
    failure: StartupFailure | None = None,
) -> Observation:
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
        request_ack_at=facts.request_ack_at,
        export_committed=facts.export_committed,
        workload_error=str(progress.get("error")) if progress.get("state") == "failed" else None,
        workload_state=progress.get("state"),
        boot_started_at=_epoch(progress.get("boot_started_at")),
        previous_boot_ended_at=_epoch(progress.get("previous_boot_ended_at")),
        startup_failure=failure.summary() if failure else None,
        startup_boot=failure.boot if failure else None,
        commit_seconds=_checkpoint_cost(progress),
        progress_at=_epoch(progress.get("updated_at_epoch")),
        stepping_at=_epoch(progress.get("stepping_at_epoch")),
        mean_step_seconds=_epoch(progress.get("mean_step_seconds")),
    )


def _checkpoint_cost(progress: dict[str, Any]) -> float | None:
    """What getting a checkpoint committed costs, as the workload measured it: a step to reach the check,
    then the slowest of its last few commits (None: no commit measured yet)."""
    commit = _epoch(progress.get("commit_seconds"))
    if commit is None:
        return None
    return commit + (_epoch(progress.get("mean_step_seconds")) or 0.0)


def is_outage(exc: BaseException) -> bool:
    """A control-plane failure worth riding out (429/5xx after the hook's retries, timeouts, refused
    connections; from the cloud's API or from GCS). Anything else (403, 400) is an answer: not an outage."""
    from interlude.hooks.errors import TransientError

    if isinstance(exc, TransientError | TimeoutError | ConnectionError):
        return True
    # The storage client's and requests' errors, only where they are loaded: the triggerer reads GCS with its own
    # httpx client and never imports them (an exception cannot be an instance of a class no module defined).
    google_errors = sys.modules.get("google.api_core.exceptions")
    if google_errors is not None and isinstance(
        exc, google_errors.TooManyRequests | google_errors.ServerError | google_errors.RetryError
    ):
        return True
    requests = sys.modules.get("requests")
    return requests is not None and isinstance(exc, requests.ConnectionError | requests.Timeout)


def unknown(now: float, error: str) -> Observation:
    """The control plane did not answer: nothing is known this poll."""
    return Observation(
        now=now, machine=Machine.UNKNOWN, notice=None, committed_step=0, progress_step=0, api_error=error
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
