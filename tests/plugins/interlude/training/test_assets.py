"""The checkpoint Asset: what the training DAG's outlet writes is what the serving DAG's resolve reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import Asset

from interlude.training.assets import (
    EXTRA_EXPORT,
    EXTRA_URI,
    FINETUNED_CHECKPOINT,
    CheckpointEvent,
    publish,
    triggering_checkpoint,
)


@dataclass
class _Accessor:
    extra: dict[str, Any] = field(default_factory=dict)


class _OutletEvents(dict):  # context["outlet_events"]: an accessor per asset, made on first use
    def __missing__(self, key: Any) -> _Accessor:
        self[key] = _Accessor()
        return self[key]


@dataclass
class _Event:  # what context["triggering_asset_events"] lists per asset
    extra: dict[str, Any]
    timestamp: str


URI = "gs://b/interlude/run-1/finetune/step_00000060/"


def test_publish_fills_only_the_checkpoint_asset() -> None:
    events = _OutletEvents()
    other = Asset(name="something_else")
    written = publish(events, [other, FINETUNED_CHECKPOINT], CheckpointEvent(URI, 60, "run-1"))
    assert written == [FINETUNED_CHECKPOINT.name]
    assert events[FINETUNED_CHECKPOINT].extra == {EXTRA_URI: URI, "step": 60, "run_key": "run-1", "stage": "finetune"}
    assert events[other].extra == {}


def test_the_event_names_the_export_and_serving_takes_it_over_the_checkpoint() -> None:
    events = _OutletEvents()
    export = "gs://b/interlude/run-1/finetune/export"
    publish(events, [FINETUNED_CHECKPOINT], CheckpointEvent(URI, 60, "run-1", export_uri=export))
    extra = events[FINETUNED_CHECKPOINT].extra
    assert extra[EXTRA_URI] == URI and extra[EXTRA_EXPORT] == export
    assert triggering_checkpoint({FINETUNED_CHECKPOINT: [_Event(extra, "2026-12-03T01:00:00+00:00")]}) == export


def test_publish_without_the_asset_as_outlet_writes_nothing() -> None:
    events = _OutletEvents()
    assert publish(events, [], CheckpointEvent(URI, 60, "run-1")) == []
    assert dict(events) == {}


def test_the_newest_triggering_event_wins_and_a_run_by_hand_has_none() -> None:
    old = _Event({EXTRA_URI: "gs://b/interlude/run-0/finetune/step_00000060/"}, "2026-12-03T01:00:00+00:00")
    new = _Event({EXTRA_URI: URI}, "2026-12-03T02:00:00+00:00")
    assert triggering_checkpoint({FINETUNED_CHECKPOINT: [new, old]}) == URI
    assert triggering_checkpoint({FINETUNED_CHECKPOINT: [old]}) == old.extra[EXTRA_URI]
    assert triggering_checkpoint(None) is None
    assert triggering_checkpoint({}) is None
    assert triggering_checkpoint({FINETUNED_CHECKPOINT: [_Event({}, "x")]}) is None
    assert triggering_checkpoint({Asset(name="other"): [new]}) is None


def test_the_serving_dag_is_scheduled_on_the_asset_the_training_dag_produces() -> None:
    from airflow.dag_processing.dagbag import DagBag

    from interlude_dev.wiring import ROOT

    bag = DagBag(str(ROOT / "dags"))
    assert not bag.import_errors, bag.import_errors
    serving, training = bag.dags["interlude_serving"], bag.dags["interlude_training"]
    assert FINETUNED_CHECKPOINT in serving.timetable.asset_condition.objects
    outlets = [o for o in training.get_task("finetune").outlets if isinstance(o, Asset)]
    assert outlets == [FINETUNED_CHECKPOINT]
