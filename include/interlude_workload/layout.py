"""The one owner of object names under a run: every GCS path Interlude reads or writes comes from here.

Both sides import it: the workload on the machine (it cannot import the Airflow package) and the
Airflow side (operators, triggers, report, links). A path spelled anywhere else is a bug: two
spellings of one path drift apart, and a run then stops finding its own checkpoints. Layout::

    gs://BUCKET/interlude/_slots/slot-N.json               slot_object: a machine slot held by one run
    gs://BUCKET/interlude/RUN_KEY/                         run_prefix
        plan/NN-STAGE.json                                 plan_object: what each boot runs
        events/STAGE-MILLIS-KIND-ID.json                   event_object: one per maintenance event
        report.json                                        report_object
        agent.json                                         agent_object: the machine agent's heartbeat
        machines/NAME.json                                 machine_intent_object: written before each create
        _preflight                                         preflight_object (written and removed at start)
        STAGE/                                             stage_prefix (checkpoints.CheckpointStore)
            checkpoints/1200/...                           Orbax's CheckpointManager root, its step dirs
                                                           (orbax_layout: commit_success.txt = finalised)
            control/request-ID.json, control/ack-ID.json, control/drill.json
            progress.json, fresh.json, log/*.log
            export/                                        export_prefix: the Hugging Face model directory
                                                           (hf_export: interlude_export.json = committed)
"""

from __future__ import annotations

ROOT = "interlude"


def slots_prefix() -> str:
    """The bucket's machine slots (interlude.machines.slots): one object per machine alive or being made."""
    return f"{ROOT}/_slots/"


def slot_object(index: int) -> str:
    return f"{slots_prefix()}slot-{index:04d}.json"


def run_prefix(run_key: str) -> str:
    return f"{ROOT}/{run_key}/"


def stage_prefix(run_key: str, stage: str) -> str:
    return f"{run_prefix(run_key)}{stage}/"


def plan_prefix(run_key: str) -> str:
    return f"{run_prefix(run_key)}plan/"


def plan_object(run_key: str, order: int, stage: str) -> str:
    return f"{plan_prefix(run_key)}{order:02d}-{stage}.json"


def events_prefix(run_key: str) -> str:
    return f"{run_prefix(run_key)}events/"


def event_object(run_key: str, stage: str, detected_ms: int, kind: str, event_id: str = "") -> str:
    """One object per event: two events of a stage never share a name (the id), a retried record does."""
    suffix = f"-{event_id}" if event_id else ""
    return f"{events_prefix(run_key)}{stage}-{detected_ms:015d}-{kind}{suffix}.json"


def report_object(run_key: str) -> str:
    return f"{run_prefix(run_key)}report.json"


def agent_object(run_key: str) -> str:
    """The machine agent's last word (state, stage, error): where the control plane looks when a stage stalls."""
    return f"{run_prefix(run_key)}agent.json"


def machine_object(run_key: str) -> str:
    """The run's current machine record, written when a stage moves it (failover); absent = provision's."""
    return f"{run_prefix(run_key)}machine.json"


def machines_prefix(run_key: str) -> str:
    return f"{run_prefix(run_key)}machines/"


def machine_intent_object(run_key: str, name: str) -> str:
    """What provision is about to create (kind, zone, name), written before the create call: teardown and
    the sweeper read it, so a create whose task was killed is never an unknown machine."""
    return f"{machines_prefix(run_key)}{name}.json"


def preflight_object(run_key: str) -> str:
    return f"{run_prefix(run_key)}_preflight"


EXPORT_DIR = "export/"


def export_prefix(run_key: str, stage: str) -> str:
    """The stage's Hugging Face export (what vLLM serves), written after its final step (hf_export)."""
    return f"{stage_prefix(run_key, stage)}{EXPORT_DIR}"


def control_prefix(run_key: str, stage: str) -> str:
    return f"{stage_prefix(run_key, stage)}control/"


def drill_marker(run_key: str, stage: str) -> str:
    """Written when a drill was asked for: a retried stage does not drill twice."""
    return f"{control_prefix(run_key, stage)}drill.json"


def uri(bucket: str, name: str) -> str:
    return f"gs://{bucket}/{name}"


PROGRESS_METADATA_KEY = "interlude-progress"
"""progress.json's custom metadata key holding a copy of its JSON, so a bucket listing carries every stage's
progress and a watcher needs no download per stage and poll (interlude.stage.facts)."""

PROGRESS_METADATA_MAX = 4096
"""Longest copy kept in the metadata (bytes of JSON). GCS allows 8 KiB of custom metadata per object
(https://cloud.google.com/storage/quotas#objects); a longer progress (a long error, large user metrics) goes
without the copy and is downloaded instead."""
