"""Carry out a move: provision where `capacity.failover.plan_move` says, record the move, remember the machine.

Called by the stage operator when re-provisioning in place fails (stockout, quota wall). The new
machine gets the run's usual name and labels, so teardown finds it like any other; its record is kept
under the run's prefix (`layout.machine_object`) so the next stage, a retry and the report use the
machine the run is really on, not the one `provision` made first.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from typing import Any

from interlude.capacity.failover import PORTABLE_FORMATS, Move, Place, Refusal, Why, move_event, plan_move
from interlude.training.spec import RunSpec

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 4
"""A move target can itself be stocked out by the time we ask; each miss is marked lost and the tree walked again."""


class MoveRefused(RuntimeError):
    """No place the run may move to (capacity, or a checkpoint that cannot load on the other family).

    ``max_wait_seconds`` > 0 when the model's profile lets the run wait for capacity to come back (the
    stage then waits in the triggerer and tries again) instead of failing at once."""

    def __init__(self, message: str, max_wait_seconds: float = 0.0) -> None:
        super().__init__(message)
        self.max_wait_seconds = max_wait_seconds


def current_machine(spec: RunSpec, provisioned: dict[str, Any] | None) -> dict[str, Any] | None:
    """The machine the run is on now: the last move's record, else what `provision` returned."""
    from google.api_core.exceptions import NotFound

    from interlude_workload import layout
    from interlude_workload.gcs import storage_client

    try:
        moved = storage_client().bucket(spec.bucket).blob(layout.machine_object(spec.run_key)).download_as_bytes()
    except NotFound:
        return provisioned
    record: dict[str, Any] = json.loads(moved)
    return record


def checkpoint_format(spec: RunSpec) -> str:
    """The format the run would carry to a new machine: a non-portable one if any stage has one."""
    from interlude.training.tasks import STAGES
    from interlude_workload.checkpoints import CheckpointStore

    formats = []
    for stage in STAGES:
        latest = CheckpointStore(spec.bucket, spec.run_key, stage).latest().checkpoint
        if latest is not None:
            formats.append(latest.format)
    odd = [f for f in formats if f not in PORTABLE_FORMATS]
    return odd[0] if odd else next(iter(sorted(PORTABLE_FORMATS)))  # nothing committed yet: nothing to carry


def _lost_places(spec: RunSpec) -> list[Place]:
    from interlude.training import events

    return [
        Place(str(e["from_zone"]), str(e["from_type"]))
        for e in events.load_events(spec.bucket, spec.run_key)
        if e.get("kind") == "move" and e.get("from_zone")
    ]


def _plan(spec: RunSpec, machine: dict[str, Any], why: Why, lost: list[Place]) -> Move | Refusal:
    from interlude.capacity.report import CapacityReport
    from interlude.training import tasks as lifecycle

    report = CapacityReport.from_dict(lifecycle.evaluate_capacity(spec))
    return plan_move(
        report,
        spec.profile(),
        spec.strategy,
        Place(machine["zone"], machine["accelerator_type"]),
        why,
        checkpoint_format(spec),
        dt.datetime.now(dt.UTC),
        lost,
    )


def _provision(
    spec: RunSpec, move: Move, gcp_conn_id: str | None, current: dict[str, Any] | None = None
) -> dict[str, Any]:
    from interlude.machines import gke, provisioning
    from interlude.training import tasks as lifecycle

    decision = move.decision.to_dict()
    if spec.spot:
        decision["mode"] = "spot"
    if current is not None and current.get("kind") == gke.KIND:
        # the run's JobSet keeps its name on the new place: the old one (its pending pod) goes first
        gke.delete_jobset(spec, current, gcp_conn_id or "google_cloud_default")
    if decision.get("platform") == "gke":  # a node pool of the new type and the run's JobSet on it
        record = gke.provision(spec, gke.machine_record(spec, decision), gcp_conn_id or "google_cloud_default")
        if current is not None and current.get("kind") == gke.KIND and current["node_pool"] != record["node_pool"]:
            for problem in gke.delete_pool(spec, current, gcp_conn_id or "google_cloud_default"):
                log.warning("The pool the run left: %s (teardown deletes it)", problem)
        return record
    runtime = lifecycle.validate_runtime(spec, decision)["runtime"]
    record = lifecycle._machine(spec, decision, runtime).to_dict()
    lifecycle.record_intent(spec, record)
    provisioning.create(record, gcp_conn_id)
    return dict(record)


def move_run(spec: RunSpec, machine: dict[str, Any], why: Why, stage: str, gcp_conn_id: str | None) -> dict[str, Any]:
    """Move the run off ``machine``'s place; return the new machine record (raises MoveRefused)."""
    from interlude.hooks.errors import QuotaExceededError, StockoutError
    from interlude.training import events
    from interlude_workload import layout
    from interlude_workload.gcs import storage_client

    started = time.time()
    lost = _lost_places(spec)
    for _ in range(MAX_ATTEMPTS):
        plan = _plan(spec, machine, why, lost)
        if isinstance(plan, Refusal):
            wait = spec.profile().max_wait.total_seconds() if plan.wait else 0.0
            raise MoveRefused(
                f"stage {stage}: cannot move off {plan.source} ({why.value}): {plan.reason}", max_wait_seconds=wait
            )
        log.warning("Moving: %s", plan.reason())
        try:
            record = _provision(spec, plan, gcp_conn_id, machine)
        except (StockoutError, QuotaExceededError) as exc:
            log.warning("Move target %s is unavailable too (%s); walking the tree again", plan.target, exc)
            lost.append(plan.target)
            continue
        storage_client().bucket(spec.bucket).blob(layout.machine_object(spec.run_key)).upload_from_string(
            json.dumps(record, sort_keys=True), content_type="application/json"
        )
        event = move_event(plan, started, time.time() - started)
        events.record_event(spec.bucket, spec.run_key, stage, event)
        log.warning("Moved: %s (%.1fs to provision)", event["reason"], event["time_lost_s"])
        return record
    raise MoveRefused(f"stage {stage}: every move target was unavailable: {', '.join(map(str, lost))}")
