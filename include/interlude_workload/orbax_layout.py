"""What Orbax leaves in GCS and when a step of it is committed, from a listing alone (the contract's pure half).

Interlude's checkpoints are Orbax's: a stage's ``CheckpointManager`` root is ``STAGE/checkpoints/`` and each step is
Orbax's default step directory ``<step>/`` (the integer, unpadded). Any job that saves there with Orbax - Interlude's
SDK or a MaxText-style trainer that never heard of Interlude - is watched, reported and resumed the same way.

Why here, with no orbax, jax, tensorstore or even a GCS client: the Airflow side (sensors, the stage trigger's
shared listing in interlude.stage.facts, failover, the report, ``fresh``) decides "committed" from bucket listings
and one small download, and the scheduler and triggerer must stay light (``import orbax.checkpoint`` costs ~2.5 s
and a few hundred MB). :class:`~interlude_workload.checkpoints.CheckpointStore` and the triggerer's async reader
both use these functions, so "committed" has one definition.

A step is **committed** when Orbax finalised it. On GCS Orbax (0.12, ``CommitFileTemporaryPath``) writes straight
into ``<step>/`` - no temporary directory, no rename - and its last write is ``<step>/commit_success.txt``, after
``_CHECKPOINT_METADATA`` got its ``commit_timestamp_nsecs``; each item directory gets its own
``commit_success.txt`` when it is done. So: listed ``commit_success.txt`` = finalised (what Orbax itself checks,
``orbax.checkpoint._src.path.atomicity.CommitFileTemporaryPath.validate_final``); a step without it is a save cut
short or in progress and is never the latest. A finalised step is then checked cheaply before anything acts on it
(:func:`check_finalised`: the step metadata parses and carries the commit time, every item it names has its own
commit marker) - a half-deleted step (Orbax's own ``rmtree`` of an old step removes objects in listing order, not
the marker first) or a hand-damaged one is rejected here. The bytes themselves are verified by the restore, which
reads every array (interlude_workload.orbax_io).

Interlude's own metrics and facts of a step (loss, the final weights' digest, why it was saved) ride in Orbax's
``custom_metadata`` under the ``"interlude"`` key of ``_CHECKPOINT_METADATA``: the one download a check makes anyway.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CHECKPOINTS = "checkpoints"
"""The stage's Orbax ``CheckpointManager`` root, relative to the stage prefix."""
COMMIT_SUCCESS = "commit_success.txt"
"""Orbax's finalisation marker on object stores (``orbax.checkpoint._src.path.atomicity_types``)."""
STEP_METADATA = "_CHECKPOINT_METADATA"
"""Orbax's step metadata (``orbax.checkpoint._src.metadata.checkpoint``): item handlers, commit time, custom."""
INTERLUDE_KEY = "interlude"
"""The key of Interlude's facts (metrics, extra, reason) inside the step metadata's ``custom_metadata``."""
FORMAT = "orbax"
"""The checkpoint format name the control plane reasons about (interlude.capacity.failover)."""
LISTING_GLOB = "**{" + COMMIT_SUCCESS + "," + STEP_METADATA + "}"
"""The objects of a step directory a watcher needs (markers and step metadata, not the arrays), as a GCS
``matchGlob`` tail: https://cloud.google.com/storage/docs/json_api/v1/objects/list#list-object-glob"""

_STEP = re.compile(rf"^{CHECKPOINTS}/(\d+)/(.+)$")


def checkpoints_prefix(stage_prefix: str) -> str:
    """``interlude/RUN_KEY/STAGE/checkpoints/``: where the stage's Orbax steps live."""
    return f"{stage_prefix}{CHECKPOINTS}/"


def step_dir(step: int) -> str:
    """Orbax's default step directory name: the integer itself (``step_prefix=None``, no fixed length)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return str(step)


@dataclass(frozen=True)
class StepStatus:
    """One Orbax step directory as listed (no downloads): name relative to the step dir -> a listed blob (anything
    with the listing's ``name``, ``size`` and ``generation``)."""

    step: int
    committed: bool  # Orbax finalised it: commit_success.txt is listed at the step's root
    objects: Mapping[str, Any]


def step_statuses(named: Iterable[tuple[str, Any]]) -> list[StepStatus]:
    """Step directories, ascending, from (name relative to the stage prefix, blob) pairs of one listing.

    Only integer directories under ``checkpoints/`` are steps: Orbax's root-level files (``metadata/``, a local
    ``<step>.orbax-checkpoint-tmp-*``) are not."""
    found: dict[int, dict[str, Any]] = {}
    for rel, blob in named:
        match = _STEP.match(rel)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = blob
    return [StepStatus(step=s, committed=COMMIT_SUCCESS in objs, objects=objs) for s, objs in sorted(found.items())]


def check_finalised(status: StepStatus, metadata_bytes: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The step metadata of a finalised step whose structure holds, or why not (a verdict: the bytes were read).

    Checks what a successful read can prove without Orbax: ``_CHECKPOINT_METADATA`` is a JSON object with
    Orbax's commit time, and each item it names (``item_handlers``) has its own ``commit_success.txt`` listed."""
    try:
        metadata = json.loads(metadata_bytes)
    except ValueError as exc:
        return None, f"{STEP_METADATA} is not JSON: {exc}"
    if not isinstance(metadata, dict):
        return None, f"{STEP_METADATA} is not an object"
    committed_ns = metadata.get("commit_timestamp_nsecs")
    if not isinstance(committed_ns, int) or isinstance(committed_ns, bool) or committed_ns <= 0:
        return None, f"{STEP_METADATA} has no commit time (the save never finished)"
    handlers = metadata.get("item_handlers")
    if isinstance(handlers, dict):
        for item in sorted(handlers):
            if f"{item}/{COMMIT_SUCCESS}" not in status.objects:
                return None, f"item {item!r} has no {COMMIT_SUCCESS} (deleted or never finished)"
    return metadata, None


def interlude_facts(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Interlude's part of a step's custom metadata ({} for a job that does not use the SDK)."""
    custom = metadata.get("custom_metadata")
    facts = custom.get(INTERLUDE_KEY) if isinstance(custom, Mapping) else None
    return dict(facts) if isinstance(facts, Mapping) else {}


def metrics_of(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """A step's metrics: Orbax's own (kept when the job tracks a best step) overlaid with Interlude's."""
    own = metadata.get("metrics")
    ours = interlude_facts(metadata).get("metrics")
    return {**(dict(own) if isinstance(own, Mapping) else {}), **(dict(ours) if isinstance(ours, Mapping) else {})}


def deletion_order(names: Iterable[str]) -> list[str]:
    """Names of one step in the order to delete them: the finalisation markers first (step, then items), then the
    step metadata, then the rest, so a step half-deleted (a kill, a failed call) never reads as committed."""

    def rank(name: str) -> tuple[int, str]:
        if name == COMMIT_SUCCESS:
            return 0, name
        if name.endswith("/" + COMMIT_SUCCESS):
            return 1, name
        return (2 if name == STEP_METADATA else 3), name

    return sorted(names, key=rank)
