"""What makes a listed step a committed checkpoint, without a GCS client (the contract's pure half).

Why apart from :mod:`interlude_workload.checkpoints`: the triggerer reads a thousand stages' facts over the GCS
JSON API with its own small async HTTP client, and importing google-cloud-storage (with google.api_core, which
imports grpc) only to reuse these rules cost its trigger runner ~15 MB. Both sides use the functions here, so
"committed" still has one definition; :class:`~interlude_workload.checkpoints.CheckpointStore` re-exports them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MANIFEST = "manifest.json"
COMMITTED = "COMMITTED"
_STEP_DIR = re.compile(r"^step-(\d{8,})/(.+)$")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class StepStatus:
    """One step directory as listed (no downloads): what exists there (name -> a ``Blob``, or anything with the
    listing's ``size`` and ``crc32c``)."""

    step: int
    committed: bool
    objects: Mapping[str, Any]


def step_statuses(named: Iterable[tuple[str, Any]]) -> list[StepStatus]:
    """Step directories, ascending, from (name relative to the stage prefix, blob) pairs of one listing."""
    found: dict[int, dict[str, Any]] = {}
    for rel, blob in named:
        match = _STEP_DIR.match(rel)
        if match:
            found.setdefault(int(match.group(1)), {})[match.group(2)] = blob
    return [StepStatus(step=s, committed=COMMITTED in objs, objects=objs) for s, objs in sorted(found.items())]


def listed_problem(name: str, blob: Any, meta: Mapping[str, Any]) -> str | None:
    """Why one payload file's listed size / CRC32C do not match its manifest entry (None: they match)."""
    if blob is None:
        return f"payload {name} missing"
    if blob.size is not None and int(blob.size) != int(meta["size"]):
        return f"payload {name}: size {blob.size} != manifest {meta['size']}"
    if blob.crc32c and blob.crc32c != meta["crc32c"]:
        return f"payload {name}: crc32c {blob.crc32c} != manifest {meta['crc32c']}"
    return None


def check_committed(
    status: StepStatus, stage: str, manifest_bytes: bytes, marker_bytes: bytes
) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest of a committed step whose marker, manifest and listed payload agree, or why not.

    COMMITTED holds sha256(manifest.json), written last; an empty marker is no evidence and never skips the
    hash check (a torn or hand-made COMMITTED). Payload files are checked against the listing (size, CRC32C)."""
    marker = marker_bytes.decode("ascii", "replace").strip()
    if marker != sha256_hex(manifest_bytes):
        return None, "manifest.json does not match the sha256 recorded in COMMITTED"
    try:
        manifest = json.loads(manifest_bytes)
    except ValueError as exc:
        return None, f"manifest.json is not JSON: {exc}"
    if not isinstance(manifest, dict):
        return None, "manifest.json is not an object"
    if manifest.get("step") != status.step or manifest.get("stage") != stage:
        return None, f"manifest names step {manifest.get('step')} stage {manifest.get('stage')}"
    files = manifest.get("files") or {}
    if not files:
        return None, "manifest lists no payload files"
    for name, meta in sorted(files.items()):
        problem = listed_problem(name, status.objects.get(name), meta)
        if problem is not None:
            return None, problem
    return manifest, None
