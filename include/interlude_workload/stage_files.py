"""A stage's small objects beside its checkpoints: control requests, progress, log chunks, the fresh marker.

Layout, per run and stage (the checkpoints themselves are Orbax's, under ``checkpoints/``: see
:mod:`interlude_workload.orbax_layout`)::

    gs://BUCKET/interlude/RUN_KEY/STAGE/control/request-<id>.json   a checkpoint request (control plane)
    gs://BUCKET/interlude/RUN_KEY/STAGE/control/ack-<id>.json       the committed step that answers it
    gs://BUCKET/interlude/RUN_KEY/STAGE/progress.json               the workload's latest progress
    gs://BUCKET/interlude/RUN_KEY/STAGE/log/<time>-<pid>-<seq>.log  the workload's log, in chunks
    gs://BUCKET/interlude/RUN_KEY/STAGE/fresh.json                  token of the last start-fresh wipe

Why apart from the checkpoints: these are Interlude's own protocol between the machine and the control plane, the
same whatever writes the checkpoints (Interlude's SDK or a job's own Orbax code); each is one small JSON object.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from google.api_core.exceptions import NotFound
from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from interlude_workload import layout
from interlude_workload.gcs import storage_client

NAME_PART = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class FreshMarkerUnreadable(Exception):
    """The fresh marker exists but says nothing usable: not evidence that a wipe is due."""


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def log_writer_id() -> str:
    """A chunk-name prefix unique to this process: boot time (sortable) plus pid."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.6f}"[1:] + f"-{os.getpid()}"


def short(exc: BaseException, limit: int = 200) -> str:
    """An exception as one bounded line (GCS error bodies can be long)."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class StageFiles:
    """The small JSON objects and logs of one (run_key, stage) in one bucket."""

    def __init__(self, bucket: str, run_key: str, stage: str, client: storage.Client | None = None) -> None:
        for label, value in (("run_key", run_key), ("stage", stage)):
            if not NAME_PART.match(value):
                raise ValueError(f"{label} {value!r} must match {NAME_PART.pattern}")
        if not bucket or "/" in bucket:
            raise ValueError(f"bucket must be a bare bucket name, got {bucket!r}")
        self.bucket_name = bucket
        self.run_key = run_key
        self.stage = stage
        self.client = client or storage_client()
        self.bucket = self.client.bucket(bucket)
        self.base = layout.stage_prefix(run_key, stage)

    def _upload(
        self, name: str, data: bytes, content_type: str, metadata: Mapping[str, str] | None = None
    ) -> storage.Blob:
        # Each of these objects is rewritten whole by its one writer: re-uploading the same bytes is harmless.
        blob = self.bucket.blob(name)
        if metadata:
            blob.metadata = dict(metadata)
        blob.upload_from_string(data, content_type=content_type, retry=DEFAULT_RETRY)
        return blob

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

    # ----------------------------------------------------------------- progress, fresh marker and logs
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
            raise FreshMarkerUnreadable(f"gs://{self.bucket_name}/{self.base}fresh.json is not JSON: {exc}") from exc
        if not isinstance(marker, dict) or not isinstance(marker.get("token"), str):
            raise FreshMarkerUnreadable(f"gs://{self.bucket_name}/{self.base}fresh.json holds no token: {marker!r}")
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
        names = sorted(b.name for b in self.client.list_blobs(self.bucket_name, prefix=self.base + "log/"))
        if tail_chunks is not None:
            names = names[-tail_chunks:]
        return "".join(self._log_chunk(name) for name in names)

    def _log_chunk(self, name: str) -> str:
        """One chunk as it is now. By name, not by the listed generation: the writer rewrites its current chunk
        with each flush, so the generation listed can be gone a moment later (a 404 that failed a reader)."""
        try:
            return self.bucket.blob(name).download_as_bytes(retry=DEFAULT_RETRY).decode("utf-8", "replace")
        except NotFound:  # removed since the listing (a fresh start wipes the stage): no lines to read
            return ""
