"""The Asset that ties training to serving: a run's fine-tuned checkpoint, committed in GCS.

The training DAG's `finetune` task lists it as an outlet and, when the stage's final checkpoint is committed,
puts the checkpoint's URI and its Hugging Face export's (`export_uri`, written by the workload at the final step:
interlude_workload.hf_export) in the event's extra (Airflow 3 `outlet_events`); `interlude_serving` is scheduled
on it and serves the export of the event that triggered it. The Asset is a fixed name, not a GCS path:
each run commits under its own prefix (and bucket), so the event, not the Asset, names the checkpoint
(https://airflow.apache.org/docs/apache-airflow/stable/authoring-and-scheduling/asset-scheduling.html).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow.sdk import Asset

# A bare name (no URI scheme): a scheme makes Airflow load every provider's URI handlers at parse time (the Google
# provider's pulls in the storage client), which the DAG files must not pay for.
FINETUNED_CHECKPOINT = Asset(name="interlude_finetuned_checkpoint")
EXTRA_URI = "checkpoint_uri"
EXTRA_EXPORT = "export_uri"


@dataclass(frozen=True)
class CheckpointEvent:
    """What an event on FINETUNED_CHECKPOINT says (its `extra`)."""

    checkpoint_uri: str
    step: int
    run_key: str
    stage: str = "finetune"
    export_uri: str | None = None

    def to_extra(self) -> dict[str, Any]:
        extra = {EXTRA_URI: self.checkpoint_uri, "step": self.step, "run_key": self.run_key, "stage": self.stage}
        return {**extra, EXTRA_EXPORT: self.export_uri} if self.export_uri else extra


def publish(outlet_events: Any, outlets: Iterable[Any], event: CheckpointEvent) -> list[str]:
    """Fill the extra of every FINETUNED_CHECKPOINT outlet; returns the asset names written (for the log)."""
    written = []
    for outlet in outlets:
        if isinstance(outlet, Asset) and outlet.name == FINETUNED_CHECKPOINT.name:
            outlet_events[outlet].extra.update(event.to_extra())
            written.append(outlet.name)
    return written


def triggering_checkpoint(triggering_asset_events: Mapping[Any, Any] | None) -> str | None:
    """What to serve from the newest of the events that triggered a run: its Hugging Face export, or (an event
    without one) its checkpoint URI, which the serving spec then refuses by name. None for a run by hand.

    `triggering_asset_events` maps each asset to its events (context["triggering_asset_events"]); several
    fine-tunes may have committed since the last serving run: the newest one is served.
    """
    found: list[tuple[str, str]] = []
    for asset, events in (triggering_asset_events or {}).items():
        if getattr(asset, "name", None) != FINETUNED_CHECKPOINT.name:
            continue
        for event in events or ():
            extra = getattr(event, "extra", None) or {}
            uri = extra.get(EXTRA_EXPORT) or extra.get(EXTRA_URI)
            if isinstance(uri, str) and uri:
                found.append((str(getattr(event, "timestamp", "")), uri))
    return max(found)[1] if found else None
