"""The sweeper's decision: which of Interlude's machines belong to DAG runs that are over.

A backstop for teardown (a run whose teardown never ran or failed): it deletes a machine only on
positive evidence that its run is finished, never by age alone, and never on an unknown. Evidence:

- the machine carries ``managed-by=interlude`` and ``interlude-run=<run_key>`` labels (queued
  resources carry no labels: their node spec's labels are read instead; a GKE node pool's are its node config's),
- its metadata names the Airflow run (``interlude-dag-id`` / ``interlude-run-id``), and that pair
  hashes to the very run key of the label (so a hand-edited or foreign value is not trusted),
- Airflow says that run is ``success`` or ``failed``.

Everything else is kept, with the reason logged. Pure: no Airflow, no cloud; `select` is tested
over every combination.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from interlude import naming
from interlude.naming import DAG_ID_METADATA, RUN_ID_METADATA

FINISHED = frozenset({"success", "failed"})
ACTIVE = frozenset({"queued", "running"})


@dataclass(frozen=True)
class Labelled:
    """One resource found in a zone that says it is Interlude's."""

    kind: str  # queued_resource | tpu_node | gce_vm | gke_node_pool
    zone: str  # a GKE node pool's: ``LOCATION/CLUSTER``
    name: str
    run_key: str
    dag_id: str | None
    run_id: str | None

    def path(self) -> str:
        if self.kind == "gke_node_pool":
            location, cluster = self.zone.split("/", 1)
            return f"locations/{location}/clusters/{cluster}/nodePools/{self.name}"
        plural = {"queued_resource": "queuedResources", "tpu_node": "nodes", "gce_vm": "instances"}[self.kind]
        return f"zones/{self.zone}/{plural}/{self.name}"

    @property
    def run(self) -> tuple[str, str] | None:
        return (self.dag_id, self.run_id) if self.dag_id and self.run_id else None


@dataclass(frozen=True)
class Verdict:
    machine: Labelled
    delete: bool
    reason: str


def _metadata(kind: str, item: Mapping[str, Any]) -> dict[str, str]:
    meta = item.get("metadata") or {}
    if kind == "gce_vm":
        return {str(i.get("key")): str(i.get("value")) for i in (meta.get("items") or [])}
    return {str(k): str(v) for k, v in meta.items()}


def labelled(kind: str, zone: str, item: Mapping[str, Any]) -> Labelled | None:
    """Read one listed resource (Google's JSON); None unless it is labelled as Interlude's."""
    body = item
    if kind == "queued_resource":  # the labels and metadata live on the node spec it creates
        specs = ((item.get("tpu") or {}).get("nodeSpec")) or [{}]
        body = specs[0].get("node") or {}
    elif kind == "gke_node_pool":  # on the pool's node config
        body = item.get("config") or {}
    labels = body.get("labels") or {}
    if labels.get("managed-by") != "interlude" or not labels.get("interlude-run"):
        return None
    meta = _metadata(kind, body)
    name = str(item.get("name") or "").rsplit("/", 1)[-1]
    return Labelled(
        kind, zone, name, labels["interlude-run"], meta.get(DAG_ID_METADATA) or None, meta.get(RUN_ID_METADATA) or None
    )


def verdict(machine: Labelled, state: str | None) -> Verdict:
    """Delete or keep one machine, given its run's state as Airflow reports it (None: unknown)."""
    run = machine.run
    if run is None:
        return Verdict(machine, False, "keep: its metadata does not name an Airflow run")
    if naming.run_key(*run) != machine.run_key:
        return Verdict(machine, False, f"keep: run {run} does not hash to its label {machine.run_key}")
    if state in FINISHED:
        return Verdict(machine, True, f"delete: run {run[1]} of {run[0]} is {state}")
    if state in ACTIVE:
        return Verdict(machine, False, f"keep: run {run[1]} of {run[0]} is {state}")
    return Verdict(machine, False, f"keep: state of run {run[1]} of {run[0]} unknown ({state})")


def select(machines: Iterable[Labelled], states: Mapping[tuple[str, str], str | None]) -> list[Verdict]:
    """One verdict per machine; a run missing from ``states`` is an unknown (kept)."""
    return [verdict(m, states.get(m.run) if m.run else None) for m in machines]
