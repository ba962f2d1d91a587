"""The checkpoint contract: the one definition of how checkpoints live in GCS.

The workload writes through this module and the Airflow side (sensors, triggers, operators) reads through
it, so the two can never disagree about what "the latest checkpoint" is. Layout, per run and stage::

    gs://BUCKET/interlude/RUN_KEY/STAGE/step-00001200/<payload files>
    gs://BUCKET/interlude/RUN_KEY/STAGE/step-00001200/manifest.json   sizes + sha256/crc32c, metrics
    gs://BUCKET/interlude/RUN_KEY/STAGE/step-00001200/COMMITTED       written last; holds sha256(manifest)
    gs://BUCKET/interlude/RUN_KEY/STAGE/control/request-<id>.json     a checkpoint request (control plane)
    gs://BUCKET/interlude/RUN_KEY/STAGE/control/ack-<id>.json         the committed step that answers it
    gs://BUCKET/interlude/RUN_KEY/STAGE/progress.json                 the workload's latest progress
    gs://BUCKET/interlude/RUN_KEY/STAGE/log/<time>-<pid>-<seq>.log   the workload's log, in chunks
    gs://BUCKET/interlude/RUN_KEY/STAGE/fresh.json                    token of the last start-fresh wipe

"Latest" is the highest step whose COMMITTED marker exists and whose manifest checksums match. Object
stores give no multi-object transactions, so correctness rests on ordering alone: payload, then the
manifest, then COMMITTED; deletion removes COMMITTED first. Nothing relies on generation preconditions
(the local emulator ignores them). A step is written by one writer at a time (one machine runs a stage),
and a deterministic trainer writes the same bytes for the same step anyway.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import google_crc32c
from google.api_core.exceptions import NotFound
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from interlude_workload import layout
from interlude_workload.committed import (
    COMMITTED,
    MANIFEST,
    StepStatus,
    check_committed,
    listed_problem,
    sha256_hex,
    step_statuses,
)
from interlude_workload.gcs import storage_client

__all__ = ["COMMITTED", "MANIFEST", "StepStatus", "sha256_hex", "step_statuses"]  # the pure half, re-exported

FORMAT = "interlude-checkpoint/1"
RESERVED_NAMES = frozenset({MANIFEST, COMMITTED})
_NAME_PART = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

VerifyMode = Literal["metadata", "full"]


class FreshMarkerUnreadable(Exception):
    """The fresh marker exists but says nothing usable: not evidence that a wipe is due."""


class CorruptCheckpoint(Exception):
    """A committed checkpoint whose bytes do not match its manifest."""


class CheckpointUnreadable(Exception):
    """A committed step could not be read (403, timeout, 5xx after the retries): no verdict either way.

    Why an exception and not a rejection: a rejected step is one a successful read proved bad, and what
    follows a rejection (rewriting the step, restoring an older one and training over the newer) destroys
    committed work. An unknown must stop those paths, never feed them.
    """


def crc32c_b64(data: bytes) -> str:
    """CRC32C as GCS reports it (base64 of the big-endian 4 bytes), so metadata can be compared."""
    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode("ascii")


def step_dir(step: int) -> str:
    """``step-%08d``: zero padding makes lexical order equal numeric order in listings and consoles."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:08d}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Checkpoint:
    """A committed, verified checkpoint: what resume and the sensors act on."""

    bucket: str
    prefix: str  # "interlude/RUN_KEY/STAGE/step-00000010/"
    step: int
    manifest: dict[str, Any]
    committed_at: datetime | None = None  # GCS creation time of COMMITTED (the storage clock)

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    @property
    def metrics(self) -> dict[str, Any]:
        return dict(self.manifest.get("metrics") or {})

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self.manifest.get("extra") or {})


@dataclass(frozen=True)
class Rejection:
    """A step that was looked at and not used, and why (shown to people, so keep it readable)."""

    step: int
    reason: str
    corrupt: bool  # True: committed but does not verify; False: merely not committed (yet)

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "reason": self.reason, "corrupt": self.corrupt}


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


class CheckpointStore:
    """Checkpoints, control requests, progress and logs of one (run_key, stage) in one bucket."""

    def __init__(self, bucket: str, run_key: str, stage: str, client: storage.Client | None = None) -> None:
        for label, value in (("run_key", run_key), ("stage", stage)):
            if not _NAME_PART.match(value):
                raise ValueError(f"{label} {value!r} must match {_NAME_PART.pattern}")
        if not bucket or "/" in bucket:
            raise ValueError(f"bucket must be a bare bucket name, got {bucket!r}")
        self.bucket_name = bucket
        self.run_key = run_key
        self.stage = stage
        self.client = client or storage_client()
        self.bucket = self.client.bucket(bucket)
        self.base = layout.stage_prefix(run_key, stage)

    # ----------------------------------------------------------------- naming
    def step_prefix(self, step: int) -> str:
        return f"{self.base}{step_dir(step)}/"

    def uri(self, step: int | None = None) -> str:
        return f"gs://{self.bucket_name}/{self.base if step is None else self.step_prefix(step)}"

    def for_stage(self, stage: str) -> CheckpointStore:
        """The same run's store for another stage (fine-tune reads train's final weights)."""
        return CheckpointStore(self.bucket_name, self.run_key, stage, client=self.client)

    # ----------------------------------------------------------------- reading
    def scan(self) -> list[StepStatus]:
        """Every step directory, ascending, from ONE list call (cheap enough for a trigger's poll)."""
        blobs = self.client.list_blobs(self.bucket_name, prefix=f"{self.base}step-")
        return step_statuses((blob.name[len(self.base) :], blob) for blob in blobs)

    def _scan_step(self, step: int) -> list[StepStatus]:
        """One step directory (a listing of its prefix alone: what a write checks before writing)."""
        blobs = self.client.list_blobs(self.bucket_name, prefix=self.step_prefix(step))
        return [s for s in step_statuses((blob.name[len(self.base) :], blob) for blob in blobs) if s.step == step]

    def list(self) -> list[StepStatus]:
        """Alias of :meth:`scan` under the name the contract promises."""
        return self.scan()

    def verify(self, status: StepStatus, mode: VerifyMode = "metadata") -> tuple[Checkpoint | None, str | None]:
        """Check one listed committed step (two downloads: manifest and COMMITTED); the checkpoint or why not."""
        return self._verify(status, mode)

    def _verify(self, status: StepStatus, mode: VerifyMode) -> tuple[Checkpoint | None, str | None]:
        """Check one committed step; return the checkpoint or the reason a successful read proved it unusable.

        Raises :class:`CheckpointUnreadable` when GCS did not answer (anything but the object itself or a 404):
        only NotFound and a real mismatch are verdicts.
        """
        objs = status.objects
        if MANIFEST not in objs:
            return None, "COMMITTED present but manifest.json missing"
        marker = self._read(status, COMMITTED)
        manifest_bytes = self._read(status, MANIFEST)
        if marker is None or manifest_bytes is None:
            return None, self._gone_reason(status)
        manifest, reason = check_committed(status, self.stage, manifest_bytes, marker)
        if manifest is None:
            return None, reason
        if mode == "full":
            for name, meta in sorted((manifest.get("files") or {}).items()):
                problem = listed_problem(name, objs.get(name), meta)
                data = self._read(status, name) if problem is None else b""
                if data is None:
                    problem = f"payload {name} missing"
                elif problem is None and sha256_hex(data) != meta["sha256"]:
                    problem = f"payload {name}: sha256 mismatch"
                if problem is not None:
                    return None, problem
        checkpoint = Checkpoint(
            bucket=self.bucket_name,
            prefix=self.step_prefix(status.step),
            step=status.step,
            manifest=manifest,
            committed_at=objs[COMMITTED].time_created,
        )
        return checkpoint, None

    def _read(self, status: StepStatus, name: str) -> bytes | None:
        """One object of a listed step: its bytes, None on a 404 (a verdict), or CheckpointUnreadable (none)."""
        try:
            return bytes(status.objects[name].download_as_bytes(retry=DEFAULT_RETRY))
        except NotFound:
            return None
        except Exception as exc:  # any other failure is an unknown, never a verdict
            raise CheckpointUnreadable(f"{self.uri(status.step)}{name}: {_short(exc)}") from exc

    def _gone_reason(self, status: StepStatus) -> str:
        """Why a listed committed step lost an object: deleted since the listing, or damaged.

        Retention and wipes delete COMMITTED first, so a step whose COMMITTED still answers while its manifest
        or a payload file is gone was damaged; one whose COMMITTED is gone too is simply no longer committed.
        """
        if self._read(status, COMMITTED) is None:
            return "deleted since the listing (COMMITTED gone)"
        return "committed, but manifest.json or a payload file is gone"

    def latest(self, verify: VerifyMode = "metadata", min_step: int = 0) -> LatestResult:
        """The highest committed step that verifies, plus every newer step skipped and why.

        ``metadata`` compares sizes and CRC32C that GCS reports in the listing (no payload download:
        what a sensor polls with); ``full`` downloads payloads and checks sha256 (what resume uses).
        A step that could not be read raises :class:`CheckpointUnreadable` (it may well be the latest).
        """
        result = LatestResult(checkpoint=None)
        for status in reversed(self.scan()):
            if status.step < min_step:
                break
            if not status.committed:
                result.rejected.append(
                    Rejection(status.step, "not committed (write incomplete or in progress)", corrupt=False)
                )
                continue
            checkpoint, reason = self._verify(status, verify)
            if checkpoint is not None:
                result.checkpoint = checkpoint
                return result
            result.rejected.append(Rejection(status.step, reason or "unknown", corrupt=True))
        return result

    def load(self, checkpoint: Checkpoint) -> dict[str, bytes]:
        """Download and sha256-verify every payload file of a checkpoint.

        A 404 or a mismatch raises :class:`CorruptCheckpoint` (proved bad); any other failed read raises
        :class:`CheckpointUnreadable` (unknown: the caller must not fall back to an older step and train over
        this one).
        """
        out: dict[str, bytes] = {}
        for name, meta in sorted((checkpoint.manifest.get("files") or {}).items()):
            try:
                data = self.bucket.blob(checkpoint.prefix + name).download_as_bytes(retry=DEFAULT_RETRY)
            except NotFound as exc:
                raise CorruptCheckpoint(f"{checkpoint.uri}{name}: missing") from exc
            except Exception as exc:  # an unknown, never a verdict
                raise CheckpointUnreadable(f"{checkpoint.uri}{name}: {_short(exc)}") from exc
            if len(data) != int(meta["size"]) or sha256_hex(data) != meta["sha256"]:
                raise CorruptCheckpoint(f"{checkpoint.uri}{name}: checksum mismatch")
            out[name] = data
        return out

    def restore(self) -> tuple[Checkpoint | None, dict[str, bytes], list[Rejection]]:
        """Latest checkpoint with its payload, falling back past any that a successful read proved bad.

        An unreadable step raises :class:`CheckpointUnreadable`: falling back past it would resume from an
        older step and then train over (rewrite) a committed one.
        """
        rejected: list[Rejection] = []
        for status in reversed(self.scan()):
            if not status.committed:
                rejected.append(
                    Rejection(status.step, "not committed (write incomplete or in progress)", corrupt=False)
                )
                continue
            checkpoint, reason = self._verify(status, "metadata")
            if checkpoint is None:
                rejected.append(Rejection(status.step, reason or "unknown", corrupt=True))
                continue
            try:
                return checkpoint, self.load(checkpoint), rejected
            except CorruptCheckpoint as exc:
                rejected.append(Rejection(status.step, str(exc), corrupt=True))
        return None, {}, rejected

    # ----------------------------------------------------------------- writing
    def write(
        self,
        step: int,
        files: Mapping[str, bytes],
        metrics: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> WriteResult:
        """Write a checkpoint: payload, manifest, then COMMITTED. A verified committed step is kept.

        A committed step that a successful read proved bad (corrupted after the fact) is un-committed first
        (COMMITTED deleted) and rewritten, so it can never be read half-replaced. One that could not be read
        raises :class:`CheckpointUnreadable` before anything is deleted or uploaded: an unknown is no proof.
        """
        if not files:
            raise ValueError("a checkpoint needs at least one payload file")
        for name in files:
            if not _FILE_NAME.match(name) or name in RESERVED_NAMES:
                raise ValueError(f"bad payload file name {name!r}")
        prefix = self.step_prefix(step)
        existing = self._scan_step(step)
        if existing and existing[0].committed:
            checkpoint, _reason = self._verify(existing[0], "metadata")
            if checkpoint is not None:
                return WriteResult(checkpoint=checkpoint, written=False)
            self.bucket.blob(prefix + COMMITTED).delete(retry=DEFAULT_RETRY)
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "run_key": self.run_key,
            "stage": self.stage,
            "step": step,
            "created_at": now_iso(),
            "files": {
                name: {"size": len(data), "sha256": sha256_hex(data), "crc32c": crc32c_b64(data)}
                for name, data in sorted(files.items())
            },
            "metrics": dict(metrics or {}),
            "extra": dict(extra or {}),
        }
        for name, data in sorted(files.items()):
            self._upload(prefix + name, data, "application/octet-stream")
        manifest_bytes = json.dumps(manifest, indent=1, sort_keys=True).encode()
        self._upload(prefix + MANIFEST, manifest_bytes, "application/json")
        # The upload's answer is the object's resource (creation time included): no GET of it afterwards.
        # https://cloud.google.com/storage/docs/json_api/v1/objects/insert#response
        committed = self._upload(prefix + COMMITTED, sha256_hex(manifest_bytes).encode(), "text/plain")
        checkpoint = Checkpoint(
            bucket=self.bucket_name, prefix=prefix, step=step, manifest=manifest, committed_at=committed.time_created
        )
        return WriteResult(checkpoint=checkpoint, written=True)

    def _upload(
        self, name: str, data: bytes, content_type: str, metadata: Mapping[str, str] | None = None
    ) -> storage.Blob:
        # Re-uploading the same bytes is harmless here (uncommitted prefix, one writer), so retry freely.
        blob = self.bucket.blob(name)
        if metadata:
            blob.metadata = dict(metadata)
        blob.upload_from_string(data, content_type=content_type, retry=DEFAULT_RETRY)
        return blob

    def _delete_step(self, status: StepStatus) -> None:
        """COMMITTED first, so a half-deleted step is never mistaken for a committed one."""
        order = sorted(status.objects, key=lambda n: (n != COMMITTED, n != MANIFEST, n))
        for name in order:
            try:
                status.objects[name].delete(retry=DEFAULT_RETRY)
            except Exception:  # noqa: BLE001 - already gone is fine; retention will try again next time
                pass

    def retain(self, keep: int) -> list[int]:
        """Keep the last ``keep`` committed steps (never the latest verified one); return deleted steps.

        Uncommitted leftovers below the latest verified step (writes cut short by a kill) go too; those
        above it may be a write in progress and stay. A step that cannot be read while finding the latest
        raises :class:`CheckpointUnreadable` before anything is deleted.
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
                self._delete_step(status)
                deleted.append(status.step)
        return deleted

    def wipe(self) -> int:
        """Delete everything of this stage (start fresh); COMMITTED markers first. Returns objects deleted."""
        blobs = list(self.client.list_blobs(self.bucket_name, prefix=self.base))
        blobs.sort(key=lambda b: (not b.name.endswith("/" + COMMITTED), b.name))
        for blob in blobs:
            try:
                blob.delete(retry=DEFAULT_RETRY)
            except Exception:  # noqa: BLE001 - already gone is fine
                pass
        return len(blobs)

    # ----------------------------------------------------------------- small JSON objects
    def _put_json(self, name: str, value: Mapping[str, Any]) -> None:
        self._upload(self.base + name, json.dumps(value, sort_keys=True).encode(), "application/json")

    def _get_json(self, name: str) -> dict[str, Any] | None:
        # One request: download, and a 404 means absent (a metadata GET first would double the calls).
        try:
            return json.loads(self.bucket.blob(self.base + name).download_as_bytes(retry=DEFAULT_RETRY))
        except NotFound:
            return None
        except Exception:  # noqa: BLE001 - not JSON (a torn write elsewhere): treat as absent
            return None

    # ----------------------------------------------------------------- control plane requests
    def request_checkpoint(self, request_id: str, reason: str = "") -> str:
        """Ask the running workload for a checkpoint; the answer appears at :meth:`checkpoint_for_request`."""
        if not _REQUEST_ID.match(request_id):
            raise ValueError(f"request_id {request_id!r} must match {_REQUEST_ID.pattern}")
        self._put_json(
            f"control/request-{request_id}.json",
            {"id": request_id, "reason": reason, "requested_at": now_iso()},
        )
        return request_id

    def pending_requests(self) -> list[str]:
        """Request ids without an acknowledgement (one list call; the workload polls this)."""
        requests: set[str] = set()
        acks: set[str] = set()
        for blob in self.client.list_blobs(self.bucket_name, prefix=self.base + "control/"):
            leaf = blob.name.rsplit("/", 1)[-1]
            if leaf.startswith("request-") and leaf.endswith(".json"):
                requests.add(leaf[len("request-") : -len(".json")])
            elif leaf.startswith("ack-") and leaf.endswith(".json"):
                acks.add(leaf[len("ack-") : -len(".json")])
        return sorted(requests - acks)

    def acknowledge(self, request_id: str, step: int) -> None:
        """Record that the committed ``step`` answers ``request_id`` (written after the commit)."""
        self._put_json(f"control/ack-{request_id}.json", {"id": request_id, "step": step, "committed_at": now_iso()})

    def checkpoint_for_request(self, request_id: str) -> int | None:
        """The committed step that answered a request, or None while it is pending."""
        ack = self._get_json(f"control/ack-{request_id}.json")
        return int(ack["step"]) if ack and "step" in ack else None

    # ----------------------------------------------------------------- progress and logs
    def write_progress(self, progress: Mapping[str, Any]) -> None:
        """progress.json, its JSON copied into the object's custom metadata when short enough: a watcher's
        bucket listing then carries the progress itself, and a thousand training stages rewriting theirs
        every second cost it no download each (``layout.PROGRESS_METADATA_KEY``). Content and metadata go up
        in one upload, so they are one generation."""
        body = json.dumps(progress, sort_keys=True)
        copy = {layout.PROGRESS_METADATA_KEY: body} if len(body) <= layout.PROGRESS_METADATA_MAX else None
        self._upload(self.base + "progress.json", body.encode(), "application/json", metadata=copy)

    def read_progress(self) -> dict[str, Any] | None:
        return self._get_json("progress.json")

    def fresh_token(self) -> str | None:
        """The token of the last start-fresh wipe; None only when GCS positively says there is no marker.

        A wipe follows a token that differs from this answer, so an unknown must never read as "absent":
        a transient error or an unreadable marker raises (the trainer then fails and is retried) instead
        of deleting every committed checkpoint of the stage.
        """
        try:
            raw = self.bucket.blob(self.base + "fresh.json").download_as_bytes(retry=DEFAULT_RETRY)
        except NotFound:
            return None
        try:
            marker = json.loads(raw)
        except ValueError as exc:
            raise FreshMarkerUnreadable(f"{self.uri()}fresh.json is not JSON: {exc}") from exc
        if not isinstance(marker, dict) or not isinstance(marker.get("token"), str):
            raise FreshMarkerUnreadable(f"{self.uri()}fresh.json holds no token: {marker!r}")
        return marker["token"]

    def set_fresh_token(self, token: str) -> None:
        self._put_json("fresh.json", {"token": token, "at": now_iso()})

    def write_log_chunk(self, writer_id: str, seq: int, lines: Iterable[str]) -> str:
        """Store a chunk of log lines; names sort by writer start time, then sequence."""
        name = f"{self.base}log/{writer_id}-{seq:06d}.log"
        self._upload(
            name,
            ("".join(line if line.endswith("\n") else line + "\n" for line in lines)).encode(),
            "text/plain",
        )
        return name

    def read_log(self, tail_chunks: int | None = None) -> str:
        """The stored log, oldest chunk first (optionally only the last ``tail_chunks`` chunks)."""
        blobs = sorted(self.client.list_blobs(self.bucket_name, prefix=self.base + "log/"), key=lambda b: b.name)
        if tail_chunks is not None:
            blobs = blobs[-tail_chunks:]
        return "".join(b.download_as_bytes(retry=DEFAULT_RETRY).decode("utf-8", "replace") for b in blobs)


def log_writer_id() -> str:
    """A chunk-name prefix unique to this process: boot time (sortable) plus pid."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.6f}"[1:] + f"-{os.getpid()}"


def _short(exc: BaseException, limit: int = 200) -> str:
    """An exception as one bounded line (GCS error bodies can be long)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
