"""The intent record: what `provision` is about to create, written to GCS before the create call.

Why before: a worker killed (or a task marked failed) after the create request left leaves a machine
that no exception handler saw. A create that may or may not have happened is an unknown, so the
record names where it could be (kind, zone, name, queued resource) and teardown deletes by those
names in that zone on top of its label sweep. The record is kept after teardown (it is the run's
history, next to its checkpoints and events); deleting a machine that is already gone is a no-op.

    gs://BUCKET/interlude/RUN_KEY/machines/NAME.json     (interlude_workload.layout.machine_intent_object)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from google.cloud import storage

from interlude.naming import queued_resource_id


@dataclass(frozen=True)
class Intent:
    """One create that was about to be sent."""

    kind: str  # tpu_node | gce_vm
    zone: str
    name: str
    queued_resource: str | None
    dag_id: str
    run_id: str
    recorded_at: float

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Intent:
        return cls(
            kind=str(data["kind"]),
            zone=str(data["zone"]),
            name=str(data["name"]),
            queued_resource=data.get("queued_resource"),
            dag_id=str(data.get("dag_id") or ""),
            run_id=str(data.get("run_id") or ""),
            recorded_at=float(data.get("recorded_at") or 0.0),
        )


def intent_for(machine: dict[str, Any], dag_id: str, run_id: str) -> Intent:
    qr = queued_resource_id(machine) if machine.get("mode") == "queued" else None
    return Intent(
        kind=machine["kind"],
        zone=machine["zone"],
        name=machine["name"],
        queued_resource=qr,
        dag_id=dag_id,
        run_id=run_id,
        recorded_at=time.time(),
    )


def record(bucket: str, run_key: str, intent: Intent, client: storage.Client | None = None) -> str:
    """Write the record; raises if GCS does not take it (then the create must not be sent)."""
    from interlude_workload import layout
    from interlude_workload.gcs import storage_client

    client = client or storage_client()
    name = layout.machine_intent_object(run_key, intent.name)
    client.bucket(bucket).blob(name).upload_from_string(
        json.dumps(asdict(intent), sort_keys=True), content_type="application/json"
    )
    return layout.uri(bucket, name)


def read(bucket: str, run_key: str, client: storage.Client | None = None) -> list[Intent]:
    """Every intent of the run. Raises on any read error: an unreadable ledger is not an empty one."""
    from interlude_workload import layout
    from interlude_workload.gcs import storage_client

    client = client or storage_client()
    out = []
    for blob in client.list_blobs(bucket, prefix=layout.machines_prefix(run_key)):
        if blob.name.endswith(".json"):
            out.append(Intent.from_dict(json.loads(blob.download_as_bytes())))
    return sorted(out, key=lambda i: i.recorded_at)
