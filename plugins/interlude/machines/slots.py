"""Machine slots: at most N machines of Interlude alive at once, counted where the machines are.

An Airflow pool counts tasks, and a run's machine lives across several of them (provision, train, the gate,
fine-tune, teardown): between two tasks its pool slot is free and another run could create a second
machine. A slot here is held from just before the create call to just after teardown confirmed that
nothing of the run is left, so it caps machines alive, as a user reads "N accelerators at once".

A slot is an object ``interlude/_slots/slot-NNNN.json`` in the run's bucket, created with
``ifGenerationMatch=0``: GCS lets exactly one writer create it
(https://cloud.google.com/storage/docs/request-preconditions), so two runs can never take the same slot,
and taking a slot again is idempotent (the holder is the run key). ``N`` is the deployment's
``[interlude] max_machines`` (``AIRFLOW__INTERLUDE__MAX_MACHINES``); unset or 0 means no cap. Runs in
different buckets do not share slots. A run holds its slot until its teardown confirms nothing is left (a
teardown that failed keeps it: clearing the teardown releases it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from interlude_workload import layout


@dataclass(frozen=True)
class Slot:
    index: int
    run_key: str
    dag_id: str
    run_id: str
    taken_at: float
    generation: int = 0


def max_machines() -> int:
    """The deployment's cap (``[interlude] max_machines``); 0 = no cap."""
    from airflow.configuration import conf
    from airflow.exceptions import AirflowConfigException

    try:
        return max(0, conf.getint("interlude", "max_machines", fallback=0))
    except (AirflowConfigException, ValueError):
        return 0  # not a number: no cap (the task log of every provision says so: see take_machine_slot)


def _client() -> Any:
    from interlude_workload.gcs import storage_client

    return storage_client()


def holders(bucket: str, client: Any = None) -> list[Slot]:
    """Every slot held in the bucket, with who holds it."""
    client = client or _client()
    out = []
    for blob in client.list_blobs(bucket, prefix=layout.slots_prefix()):
        generation = int(blob.generation or 0)  # as listed: a download may rewrite the blob's properties
        try:
            data = json.loads(blob.download_as_bytes(if_generation_match=generation))
        except Exception:  # noqa: BLE001 - released between list and read: not held
            continue
        index = int(blob.name.rsplit("-", 1)[-1].split(".")[0])
        out.append(
            Slot(
                index,
                str(data.get("run_key")),
                str(data.get("dag_id")),
                str(data.get("run_id")),
                float(data.get("taken_at") or 0),
                generation,
            )
        )
    return sorted(out, key=lambda s: s.index)


def take(bucket: str, run_key: str, dag_id: str, run_id: str, cap: int, client: Any = None) -> int | None:
    """Take a free slot for the run (or find the one it holds); None when all ``cap`` are held by others."""
    from google.api_core.exceptions import PreconditionFailed

    client = client or _client()
    mine = [s.index for s in holders(bucket, client) if s.run_key == run_key]
    if mine:
        return mine[0]
    body = json.dumps({"run_key": run_key, "dag_id": dag_id, "run_id": run_id, "taken_at": time.time()})
    for index in range(cap):
        blob = client.bucket(bucket).blob(layout.slot_object(index))
        try:
            blob.upload_from_string(body, content_type="application/json", if_generation_match=0)
            return index
        except PreconditionFailed:
            continue
    return None


def release(bucket: str, run_key: str, client: Any = None) -> list[int]:
    """Free the run's slots (only if still the run's: the generation must match what was read)."""
    from google.api_core.exceptions import NotFound, PreconditionFailed

    client = client or _client()
    freed = []
    for slot in holders(bucket, client):
        if slot.run_key != run_key:
            continue
        try:
            client.bucket(bucket).blob(layout.slot_object(slot.index)).delete(if_generation_match=slot.generation)
            freed.append(slot.index)
        except (NotFound, PreconditionFailed):
            continue
    return freed
