"""What the operator tests stand in for: the task instance's XComs and the triggerer (nothing else is faked).

An operator reads its upstream tasks' results through ``context["ti"].xcom_pull``; `XComs` answers that from a
dict, through JSON (XCom stores JSON, so an operator that depends on Python objects surviving would fail here
as it fails in Airflow). `drive` does what Airflow does with a deferrable operator: call ``execute``; on
``TaskDeferred``, rebuild the trigger from its serialized form (as the triggerer does: only the kwargs cross),
run it to its first event, and resume a fresh operator (a resumed task is a new instance) at the method named.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk.exceptions import TaskDeferred

from interlude_localcloud.testing import RunningLocalCloud

ZONE = "us-central1-a"
DAG_ID = "interlude_training"
TRIGGER_TIMEOUT = 120.0  # seconds one trigger may take to yield its event (a deadline for a busy machine, not a timing)


class XComs:
    """The `ti` of a context: ``xcom_pull(task_ids=...)`` returns what that task returned (or None)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.values = {k: json.loads(json.dumps(v)) for k, v in values.items()}

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        assert key == "return_value", key
        value = self.values.get(task_ids)
        return None if value is None else json.loads(json.dumps(value))


def context(**xcoms: Any) -> dict[str, Any]:
    """A context whose ``ti`` holds these XComs (task ids with dots are passed as ``**{"a.b": ...}``)."""
    return {"ti": XComs(xcoms)}


def rebuilt(trigger: Any) -> Any:
    """The trigger as the triggerer makes it: from ``serialize()``'s dotted path and JSON kwargs."""
    path, kwargs = trigger.serialize()
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)(**json.loads(json.dumps(kwargs)))


def first_event(trigger: Any, timeout: float = TRIGGER_TIMEOUT) -> dict[str, Any]:
    """Run the (rebuilt) trigger until its first event; its payload."""

    async def run() -> dict[str, Any]:
        event = await asyncio.wait_for(anext(rebuilt(trigger).run()), timeout)
        return dict(event.payload)

    return asyncio.run(run())


@dataclass
class Driven:
    """What a driven task came to, and each deferral on the way (trigger class path, method resumed)."""

    result: Any
    deferrals: list[tuple[str, str]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def drive(make_op: Callable[[], Any], ctx: dict[str, Any], rounds: int = 12, budget: float = 300.0) -> Driven:
    """Execute the task and resume it after each deferral until it returns (an exception propagates); at most
    `rounds` deferrals and `budget` seconds of waiting for events in all (a bound for a broken run, not a timing)."""
    driven = Driven(None)
    deadline = time.monotonic() + budget
    call: Callable[[], Any] = lambda: make_op().execute(ctx)  # noqa: E731
    for _ in range(rounds):
        try:
            driven.result = call()
            return driven
        except TaskDeferred as deferred:
            driven.deferrals.append((deferred.trigger.serialize()[0], deferred.method_name))
            event = first_event(deferred.trigger, max(1.0, min(TRIGGER_TIMEOUT, deadline - time.monotonic())))
            driven.events.append(event)
            call = lambda m=deferred.method_name, e=event: getattr(make_op(), m)(ctx, e)  # noqa: E731
    raise AssertionError(f"still deferring after {rounds} rounds: {driven.deferrals}")


@dataclass
class TrainingRun:
    """One run's upstream XComs, made by the lifecycle DAG's own task functions against the cloud."""

    spec: Any  # RunSpec
    report: dict[str, Any]
    validated: dict[str, Any]

    def xcoms(self) -> dict[str, Any]:
        return {
            "resolve_run": self.spec.to_dict(),
            "validate_runtime": self.validated,
            "choose.evaluate_capacity": self.report,
        }


def training_run(bucket: str, **params: Any) -> TrainingRun:
    """resolve_run's RunSpec (the params checked as the form's are), then evaluate_capacity, decide and
    validate_runtime as the DAG runs them; a fresh run id each time, so runs of one module never meet."""
    from interlude import naming
    from interlude.training import tasks
    from interlude.training.spec import RunSpec

    run_id = f"manual__{uuid.uuid4().hex[:8]}"
    spec = RunSpec.from_params(
        {"bucket": bucket, "zones": [ZONE], "poll_seconds": 0.1, "data_date": "2024-01-15", **params},
        dag_id=DAG_ID,
        run_id=run_id,
        run_key=naming.run_key(DAG_ID, run_id),
    )
    report = tasks.evaluate_capacity(spec)
    validated = tasks.validate_runtime(spec, tasks.decide(spec, report))
    return TrainingRun(spec, report, validated)


def machines_of(cloud: RunningLocalCloud, run_key: str) -> list[dict[str, Any]]:
    """The run's nodes and VMs as the cloud itself lists them (its admin view, not Interlude's account)."""
    return [m for m in cloud.admin.machines() if m["name"].startswith(run_key)]
