"""Teardown that cannot leak quietly: every zone, every failure reported, the result checked.

The promise: when teardown succeeds, nothing of the run is left in any zone it could have touched
(the run's candidate zones plus every zone an intent record names). A zone whose list call fails is
not a reason to stop (the other zones still get cleaned) and not a reason to succeed either: it is a
zone where the run's machines are unknown, so the report is incomplete and the task fails. After the
deletes, every listed zone is listed again; anything of the run still there fails the task too.

Resources of a run: TPU nodes and Compute Engine VMs carry the label ``interlude-run=<run_key>``
(https://cloud.google.com/tpu/docs/labeling-resources, https://cloud.google.com/compute/docs/labeling-resources);
queued resources carry no labels, so they are found by the ``<run_key>-`` name prefix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from interlude.hooks.machines import machine_hooks
from interlude.machines.ledger import Intent
from interlude.machines.sweeper import labelled, select

log = logging.getLogger(__name__)

KINDS = ("queued_resource", "tpu_node", "gce_vm")  # delete order: a queued resource takes its node with it


@dataclass(frozen=True, order=True)
class Resource:
    kind: str  # one of KINDS
    zone: str
    name: str

    def path(self) -> str:
        plural = {"queued_resource": "queuedResources", "tpu_node": "nodes", "gce_vm": "instances"}[self.kind]
        return f"zones/{self.zone}/{plural}/{self.name}"


@dataclass
class TeardownReport:
    """What teardown did and what it could not confirm."""

    zones: list[str]
    deleted: list[str] = field(default_factory=list)
    unlisted: dict[str, str] = field(default_factory=dict)  # zone -> why it could not be listed
    failed: dict[str, str] = field(default_factory=dict)  # resource path -> why its delete failed
    remaining: list[str] = field(default_factory=list)  # still listed after the deletes

    @property
    def complete(self) -> bool:
        return not (self.unlisted or self.failed or self.remaining)

    def problems(self) -> str:
        lines = [f"zone {z} could not be listed: {why}" for z, why in sorted(self.unlisted.items())]
        lines += [f"delete of {p} failed: {why}" for p, why in sorted(self.failed.items())]
        lines += [f"{p} is still there after its delete" for p in self.remaining]
        return "\n  ".join(lines)


class TeardownIncomplete(RuntimeError):
    """Teardown could not confirm that nothing of the run is left."""

    def __init__(self, run_key: str, report: TeardownReport) -> None:
        self.report = report
        super().__init__(
            f"teardown of run {run_key} is incomplete (machines may still cost money):\n  "
            f"{report.problems()}\ndeleted: {report.deleted}"
        )


def run_zones(zones: Iterable[str], intents: Iterable[Intent]) -> list[str]:
    """Every zone the run could have touched, in a stable order (candidates first)."""
    out: list[str] = []
    for zone in [*zones, *(i.zone for i in intents)]:
        if zone not in out:
            out.append(zone)
    return out


def owned(run_key: str, kind: str, item: dict[str, Any]) -> bool:
    """Is this listed resource the run's? Labels for nodes and VMs, the name prefix for queued resources."""
    short = str(item.get("name") or "").rsplit("/", 1)[-1]
    if kind == "queued_resource":
        return short.startswith(run_key + "-")
    return (item.get("labels") or {}).get("interlude-run") == run_key


def list_run(run_key: str, zone: str, tpu: Any, compute: Any) -> list[Resource]:
    """The run's resources in one zone; raises when any of the three list calls fails."""
    found = [
        Resource("queued_resource", zone, q["name"].rsplit("/", 1)[-1])
        for q in tpu.list_queued_resources(zone)
        if owned(run_key, "queued_resource", q)
    ]
    found += [
        Resource("tpu_node", zone, n["name"].rsplit("/", 1)[-1])
        for n in tpu.list_nodes(zone)
        if owned(run_key, "tpu_node", n)
    ]
    vms = compute.list_instances(zone, filter=f"labels.interlude-run = {run_key}")
    found += [Resource("gce_vm", zone, v["name"]) for v in vms if owned(run_key, "gce_vm", v)]
    return found


def intended(intents: Iterable[Intent], zone: str) -> list[Resource]:
    """Resources an intent record says may exist in the zone (deleting a missing one is a no-op)."""
    out = []
    for i in intents:
        if i.zone != zone:
            continue
        if i.queued_resource:
            out.append(Resource("queued_resource", zone, i.queued_resource))
        out.append(Resource(i.kind, zone, i.name))
    return out


def delete(resource: Resource, tpu: Any, compute: Any) -> None:
    if resource.kind == "queued_resource":
        tpu.delete_queued_resource(resource.zone, resource.name, force=True)
    elif resource.kind == "tpu_node":
        tpu.delete_node(resource.zone, resource.name)
    else:
        compute.delete_instance(resource.zone, resource.name)


def _ordered(resources: Iterable[Resource]) -> list[Resource]:
    return sorted(set(resources), key=lambda r: (KINDS.index(r.kind), r.name))


def sweep_run(run_key: str, zones: Iterable[str], intents: Iterable[Intent], tpu: Any, compute: Any) -> TeardownReport:
    """Delete everything of the run in every zone, then list again. Never raises: the report says it all."""
    intents = list(intents)
    report = TeardownReport(zones=run_zones(zones, intents))
    for zone in report.zones:
        try:
            found = list_run(run_key, zone, tpu, compute)
        except Exception as exc:  # noqa: BLE001 - one zone's failure must not stop the others
            log.error("Teardown: cannot list zone %s: %s", zone, exc)
            report.unlisted[zone] = f"{type(exc).__name__}: {exc}"
            found = []
        for resource in _ordered([*found, *intended(intents, zone)]):
            try:
                delete(resource, tpu, compute)
            except Exception as exc:  # noqa: BLE001 - reported, and the task fails at the end
                log.error("Teardown: delete of %s failed: %s", resource.path(), exc)
                report.failed[resource.path()] = f"{type(exc).__name__}: {exc}"
                continue
            if resource in found:
                report.deleted.append(resource.path())
    for zone in report.zones:
        if zone in report.unlisted:
            continue
        try:
            report.remaining += [r.path() for r in list_run(run_key, zone, tpu, compute)]
        except Exception as exc:  # noqa: BLE001
            report.unlisted[zone] = f"(after the deletes) {type(exc).__name__}: {exc}"
    return report


def list_labelled(zone: str, tpu: Any, compute: Any) -> list[Any]:
    """Every resource in the zone labelled as Interlude's (for the sweeper); raises if a list fails."""
    items = [("queued_resource", q) for q in tpu.list_queued_resources(zone)]
    items += [("tpu_node", n) for n in tpu.list_nodes(zone)]
    items += [("gce_vm", v) for v in compute.list_instances(zone, filter="labels.managed-by = interlude")]
    return [m for kind, item in items if (m := labelled(kind, zone, item)) is not None]


def sweep_finished(zones: Iterable[str], state_of: Any, tpu: Any, compute: Any) -> TeardownReport:
    """Delete the machines of finished runs (see interlude.machines.sweeper); `state_of((dag_id, run_id))` asks
    Airflow."""
    report = TeardownReport(zones=list(zones))
    for zone in report.zones:
        try:
            found = list_labelled(zone, tpu, compute)
        except Exception as exc:  # noqa: BLE001 - the other zones still get swept
            report.unlisted[zone] = f"{type(exc).__name__}: {exc}"
            continue
        states = {m.run: state_of(m.run) for m in found if m.run}
        for v in select(found, states):
            log.info("Sweeper: %s %s", v.machine.path(), v.reason)
            if not v.delete:
                continue
            try:
                delete(Resource(v.machine.kind, zone, v.machine.name), tpu, compute)
                report.deleted.append(v.machine.path())
            except Exception as exc:  # noqa: BLE001
                report.failed[v.machine.path()] = f"{type(exc).__name__}: {exc}"
    return report


def teardown_run(
    run_key: str, zones: list[str], gcp_conn_id: str | None, intents: list[Intent] | None = None
) -> TeardownReport:
    """Delete every node, queued resource and VM of this run in every zone it could have touched (see
    :func:`sweep_run` for the promise), through the hooks of one Airflow connection."""
    tpu, compute = machine_hooks(gcp_conn_id)
    return sweep_run(run_key, zones, intents or [], tpu, compute)
