"""The checkpoint contract over Orbax's layout: the one place that says which step of a stage counts.

The workload saves with Orbax (interlude_workload.orbax_io, through the SDK or a job's own code) into the stage's
``CheckpointManager`` root, and the Airflow side (sensors, triggers, failover, the report, ``fresh``) reads through
:class:`CheckpointStore`, so the two never disagree about what "the latest checkpoint" is. Layout, per run and stage::

    gs://BUCKET/interlude/RUN_KEY/STAGE/checkpoints/<step>/...        Orbax's step directory (the manager's root)
    gs://BUCKET/interlude/RUN_KEY/STAGE/checkpoints/<step>/commit_success.txt   Orbax's last write: finalised
    gs://BUCKET/interlude/RUN_KEY/STAGE/control/, progress.json, log/, fresh.json  (interlude_workload.stage_files)

The contract, stated over Orbax's layout:

* a step is committed only when Orbax finalised it (``commit_success.txt``, and step metadata with a commit
  time: :func:`interlude_workload.orbax_layout.check_finalised`); a save cut short is never the latest;
* it is verified before it is restored (the restore reads every array; a step a successful read proved bad is
  rejected and reported, and the one before is tried);
* nothing committed is overwritten or deleted on an unknown: a read that failed (403, timeout, 5xx after the
  retries) raises :class:`CheckpointUnreadable`, which stops restore, retention and rewrites alike;
* retention keeps the last K committed steps and never the latest verified one, deleting markers first.

This module imports no orbax, jax or tensorstore: listings and one small JSON download decide "committed", so the
scheduler and triggerer stay light. Writing and restoring (which need Orbax) import interlude_workload.orbax_io
when first called.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from google.api_core.exceptions import NotFound
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from interlude_workload import orbax_layout
from interlude_workload.orbax_layout import COMMIT_SUCCESS, STEP_METADATA, StepStatus, step_statuses
from interlude_workload.stage_files import FreshMarkerUnreadable, StageFiles, log_writer_id, now_iso, short

if TYPE_CHECKING:
    from interlude_workload.orbax_io import Restored

__all__ = [
    "COMMIT_SUCCESS",
    "STEP_METADATA",
    "Checkpoint",
    "CheckpointStore",
    "CheckpointUnreadable",
    "CorruptCheckpoint",
    "FreshMarkerUnreadable",
    "LatestResult",
    "Rejection",
    "StepStatus",
    "WriteResult",
    "log_writer_id",
    "now_iso",
    "step_statuses",
]

VerifyMode = Literal["metadata", "full"]


class CorruptCheckpoint(Exception):
    """A committed checkpoint that a successful read proved unusable."""


class CheckpointUnreadable(Exception):
    """A committed step could not be read (403, timeout, 5xx after the retries): no verdict either way.

    Why an exception and not a rejection: a rejected step is one a successful read proved bad, and what
    follows a rejection (rewriting the step, restoring an older one and training over the newer) destroys
    committed work. An unknown must stop those paths, never feed them.
    """


@dataclass(frozen=True)
class Checkpoint:
    """A committed, verified Orbax step: what resume and the sensors act on."""

    bucket: str
    prefix: str  # "interlude/RUN_KEY/STAGE/checkpoints/10/"
    step: int
    metadata: dict[str, Any]  # Orbax's _CHECKPOINT_METADATA of the step
    committed_at: datetime | None = None  # GCS creation time of commit_success.txt (the storage clock)

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    @property
    def metrics(self) -> dict[str, Any]:
        return orbax_layout.metrics_of(self.metadata)

    @property
    def extra(self) -> dict[str, Any]:
        return dict(orbax_layout.interlude_facts(self.metadata).get("extra") or {})

    @property
    def format(self) -> str:
        return orbax_layout.FORMAT


@dataclass(frozen=True)
class Rejection:
    """A step that was looked at and not used, and why (shown to people, so keep it readable)."""

    step: int
    reason: str
    corrupt: bool  # True: committed but does not verify; False: merely not committed (yet)

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "reason": self.reason, "corrupt": self.corrupt}


NOT_COMMITTED = "not finalised by Orbax (save cut short or in progress)"


@dataclass
class LatestResult:
    checkpoint: Checkpoint | None
    rejected: list[Rejection] = field(default_factory=list)

    @property
    def corrupt(self) -> list[Rejection]:
        return [r for r in self.rejected if r.corrupt]


@dataclass(frozen=True)
class WriteResult:
    checkpoint: Checkpoint
    written: bool  # False when the step was already committed (and verified) and was left alone


class CheckpointStore(StageFiles):
    """The Orbax checkpoints of one (run_key, stage) in one bucket, plus the stage's small files."""

    def __init__(self, bucket: str, run_key: str, stage: str, client: storage.Client | None = None) -> None:
        super().__init__(bucket, run_key, stage, client)
        self.checkpoints_prefix = orbax_layout.checkpoints_prefix(self.base)

    # ----------------------------------------------------------------- naming
    def step_prefix(self, step: int) -> str:
        return f"{self.checkpoints_prefix}{orbax_layout.step_dir(step)}/"

    def uri(self, step: int | None = None) -> str:
        return f"gs://{self.bucket_name}/{self.base if step is None else self.step_prefix(step)}"

    @property
    def checkpoints_uri(self) -> str:
        """The Orbax ``CheckpointManager`` root of this stage (no trailing slash, as Orbax names directories)."""
        return f"gs://{self.bucket_name}/{self.checkpoints_prefix.rstrip('/')}"

    def for_stage(self, stage: str) -> CheckpointStore:
        """The same run's store for another stage (fine-tune reads train's final weights)."""
        return CheckpointStore(self.bucket_name, self.run_key, stage, client=self.client)

    # ----------------------------------------------------------------- reading
    def scan(self) -> list[StepStatus]:
        """Every step directory, ascending, from ONE list call (cheap enough for a trigger's poll)."""
        blobs = self.client.list_blobs(self.bucket_name, prefix=self.checkpoints_prefix)
        return step_statuses((blob.name[len(self.base) :], blob) for blob in blobs)

    def scan_step(self, step: int) -> StepStatus | None:
        """One step directory (a listing of its prefix alone: what a write checks before writing)."""
        blobs = self.client.list_blobs(self.bucket_name, prefix=self.step_prefix(step))
        found = [s for s in step_statuses((b.name[len(self.base) :], b) for b in blobs) if s.step == step]
        return found[0] if found else None

    def list(self) -> list[StepStatus]:
        """Alias of :meth:`scan` under the name the contract promises."""
        return self.scan()

    def verify(self, status: StepStatus, mode: VerifyMode = "metadata") -> tuple[Checkpoint | None, str | None]:
        """Check one listed finalised step; the checkpoint, or the reason a successful read proved it unusable.

        ``metadata``: one download (the step metadata) and the listing; ``full``: also restore it with Orbax,
        reading every array. Raises :class:`CheckpointUnreadable` when GCS did not answer (anything but the
        object itself or a 404): only NotFound and a real mismatch are verdicts.
        """
        if STEP_METADATA not in status.objects:
            return None, f"finalised, but {STEP_METADATA} is missing"
        raw = self.read_listed(status, STEP_METADATA)
        if raw is None:
            return None, self._gone_reason(status)
        metadata, reason = orbax_layout.check_finalised(status, raw)
        if metadata is None:
            return None, reason
        marker = status.objects.get(COMMIT_SUCCESS)
        checkpoint = Checkpoint(
            bucket=self.bucket_name,
            prefix=self.step_prefix(status.step),
            step=status.step,
            metadata=metadata,
            committed_at=getattr(marker, "time_created", None),
        )
        if mode == "full":
            from interlude_workload import orbax_io  # Orbax only where a full read is asked for

            try:
                with orbax_io.bound_to(self):
                    orbax_io.read_step(self, checkpoint)
            except CorruptCheckpoint as exc:
                return None, str(exc)
        return checkpoint, None

    def read_listed(self, status: StepStatus, name: str) -> bytes | None:
        """One listed object of a step: its bytes, None on a 404 (a verdict), or CheckpointUnreadable (none)."""
        try:
            return bytes(status.objects[name].download_as_bytes(retry=DEFAULT_RETRY))
        except NotFound:
            return None
        except Exception as exc:  # any other failure is an unknown, never a verdict
            raise CheckpointUnreadable(f"{self.uri(status.step)}{name}: {short(exc)}") from exc

    def _gone_reason(self, status: StepStatus) -> str:
        """Why a listed finalised step lost an object: deleted since the listing, or damaged.

        Retention and wipes delete the commit markers first, so a step whose marker still answers while its
        metadata is gone was damaged; one whose marker is gone too is simply no longer committed.
        """
        if self.read_listed(status, COMMIT_SUCCESS) is None:
            return f"deleted since the listing ({COMMIT_SUCCESS} gone)"
        return f"finalised, but {STEP_METADATA} is gone"

    def latest(self, verify: VerifyMode = "metadata", min_step: int = 0) -> LatestResult:
        """The highest finalised step that verifies, plus every newer step skipped and why.

        ``metadata`` (what a sensor polls with) checks the listing and the step metadata; ``full`` restores
        with Orbax too. A step that could not be read raises :class:`CheckpointUnreadable` (it may well be the
        latest).
        """
        result = LatestResult(checkpoint=None)
        for status in reversed(self.scan()):
            if status.step < min_step:
                break
            if not status.committed:
                result.rejected.append(Rejection(status.step, NOT_COMMITTED, corrupt=False))
                continue
            checkpoint, reason = self.verify(status, verify)
            if checkpoint is not None:
                result.checkpoint = checkpoint
                return result
            result.rejected.append(Rejection(status.step, reason or "unknown", corrupt=True))
        return result

    # ----------------------------------------------------------------- Orbax reads and writes (import Orbax)
    def load(self, checkpoint: Checkpoint) -> dict[str, Any]:
        """Every item of a checkpoint as Orbax restores it ({"state": pytree, "meta": dict} for the SDK's).

        Raises :class:`CorruptCheckpoint` (proved bad) or :class:`CheckpointUnreadable` (unknown: the caller
        must not fall back to an older step and train over this one)."""
        from interlude_workload import orbax_io

        with orbax_io.bound_to(self):
            return orbax_io.read_step(self, checkpoint)

    def restore(self) -> tuple[Checkpoint | None, dict[str, Any], list[Rejection]]:
        """Latest checkpoint with its items, falling back past any that a successful read proved bad.

        An unreadable step raises :class:`CheckpointUnreadable`: falling back past it would resume from an
        older step and then train over (rewrite) a committed one.
        """
        from interlude_workload import orbax_io

        with orbax_io.bound_to(self):
            restored, rejected = orbax_io.restore_latest(self)
        if restored is None:
            return None, {}, rejected
        return restored.checkpoint, restored.items, rejected

    def restore_latest(self, target: Any = None) -> tuple[Restored | None, list[Rejection]]:
        """The SDK's resume: the latest verified step restored through Orbax (see orbax_io.restore_latest)."""
        from interlude_workload import orbax_io

        with orbax_io.bound_to(self):
            return orbax_io.restore_latest(self, target=target)

    def write(
        self,
        step: int,
        state: Mapping[str, Any],
        metrics: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Save one step with Orbax (a one-off manager: tools and tests; the SDK keeps one open), waiting for
        Orbax to finalise it. A verified committed step is kept (``written`` False)."""
        from interlude_workload import orbax_io

        with orbax_io.bound_to(self), orbax_io.open_manager(self) as manager:
            return orbax_io.commit(self, manager, step, state, meta=meta, metrics=metrics, extra=extra)

    # ----------------------------------------------------------------- deleting
    def delete_step(self, status: StepStatus) -> None:
        """Markers first (orbax_layout.deletion_order), so a half-deleted step is never mistaken for a committed
        one. Best effort: an object already gone is fine, and retention tries again next time."""
        for name in orbax_layout.deletion_order(status.objects):
            try:
                status.objects[name].delete(retry=DEFAULT_RETRY)
            except Exception:  # noqa: BLE001 - already gone is fine; retention will try again next time
                pass

    def retain(self, keep: int) -> list[int]:
        """Keep the last ``keep`` committed steps (never the latest verified one); return deleted steps.

        Uncommitted leftovers below the latest verified step (saves cut short by a kill) go too; those above
        it may be a save in progress and stay. A step that cannot be read while finding the latest raises
        :class:`CheckpointUnreadable` before anything is deleted.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1")
        statuses = self.scan()
        latest = self.latest(verify="metadata").checkpoint
        latest_step = latest.step if latest is not None else None
        committed = [s for s in statuses if s.committed]
        keep_steps = {s.step for s in committed[-keep:]}
        if latest_step is not None:
            keep_steps.add(latest_step)
        deleted: list[int] = []
        for status in statuses:
            if status.step in keep_steps:
                continue
            stale = latest_step is not None and status.step < latest_step
            if status.committed or stale:
                self.delete_step(status)
                deleted.append(status.step)
        return deleted

    def wipe(self) -> int:
        """Delete everything of this stage (start fresh); commit markers first. Returns objects deleted."""
        blobs = list(self.client.list_blobs(self.bucket_name, prefix=self.base))
        statuses = step_statuses((blob.name[len(self.base) :], blob) for blob in blobs)
        for status in statuses:
            self.delete_step(status)
        stepped = {id(blob) for status in statuses for blob in status.objects.values()}
        for blob in blobs:
            if id(blob) not in stepped:
                try:
                    blob.delete(retry=DEFAULT_RETRY)
                except Exception:  # noqa: BLE001 - already gone is fine
                    pass
        return len(blobs)
