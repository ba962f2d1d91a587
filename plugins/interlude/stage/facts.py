"""A stage's GCS facts for many watchers from one bucket listing per interval.

Why: a triggerer watching a thousand stages used to read each stage's facts itself (a list, the progress
object, and two downloads to re-verify the same COMMITTED marker every time). Here every watcher in the
process shares one listing of the bucket's ``interlude/`` tree per interval, narrowed with ``matchGlob`` to
the objects the facts come from (step directories, control acks, progress.json; not logs or events), and
each stage's reader downloads only what changed since its last look, by object generation: a finalised Orbax
step's metadata once per generation (a step is never re-verified while it is unchanged), an ack once.
progress.json is rewritten about every second by a training stage, so it is not downloaded at all: the workload
copies its JSON into the object's custom metadata (``layout.PROGRESS_METADATA_KEY``), which the listing returns;
only a progress too long for the copy (or written without it) is downloaded. A stage, calm or training, then
costs no GCS call of its own.

The reads go over GCS's JSON API with httpx (interlude.hooks.gcs_json: no google-cloud-storage, google.api_core
or grpc in the trigger runner); the checks that make a step committed are the checkpoint contract's own
(interlude_workload.orbax_layout: Orbax's commit_success.txt and _CHECKPOINT_METADATA; the listing asks only for
those, not for the arrays' objects).

Object generations: https://cloud.google.com/storage/docs/metadata#generation-number ; listing with a
glob: https://cloud.google.com/storage/docs/json_api/v1/objects/list#list-object-glob
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import itertools
import json
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from interlude.hooks.gcs_json import GcsJson, shared_gcs
from interlude.stage.observe import NO_ACK, Ack, StageFacts, ack_of
from interlude_workload.hf_export import STAGE_MARKER
from interlude_workload.layout import EXPORT_DIR, PROGRESS_METADATA_KEY, ROOT
from interlude_workload.orbax_layout import CHECKPOINTS, COMMIT_SUCCESS, STEP_METADATA, check_finalised, step_statuses

# GCS forbids "/" and "**" inside braces, hence two globs: Orbax's markers and step metadata (not the arrays' many
# objects) and the control objects, then progress.
GLOBS = (
    f"{ROOT}/*/*/{{{CHECKPOINTS},control,{EXPORT_DIR.rstrip('/')}}}/**{{{COMMIT_SUCCESS},{STEP_METADATA},.json}}",
    f"{ROOT}/*/*/progress.json",
)
# What each glob's listing returns (a partial response): progress.json's also its custom metadata (the copy).
FIELDS = (
    "items(name,generation,size,crc32c,timeCreated),nextPageToken",
    "items(name,generation,metadata),nextPageToken",
)
PROGRESS = "progress.json"


class Listed(NamedTuple):
    """What the listing says of one object, and no more: a thousand stages' objects are held between polls
    (a listed ``Blob`` with its full metadata costs several KB; this a hundred bytes)."""

    name: str
    generation: int | None
    size: int | None
    crc32c: str | None
    time_created: str | None  # RFC 3339, as listed (parsed only by the few blobs a download rebuilds)
    progress: str | None = None  # progress.json's JSON as copied into its metadata (None: no copy)


StageObjects = Mapping[str, Listed]  # name relative to the stage prefix -> what the listing said
BucketIndex = Mapping[str, StageObjects]  # stage prefix "interlude/RUN_KEY/STAGE/" -> its objects


def index_by_stage(items: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Listed]]:
    """Group listed objects (the listing's JSON items) by stage prefix (the first three path segments under
    interlude/)."""
    out: dict[str, dict[str, Listed]] = {}
    for item in items:
        name = str(item.get("name") or "")
        parts = name.split("/", 3)
        if len(parts) == 4 and parts[0] == ROOT:
            # timeCreated stays the raw string: parsing 4,000 timestamps per listing with strptime was half of the
            # listing thread's CPU, for a value only a download ever reads.
            listed = Listed(
                name,
                _int(item.get("generation")),
                _int(item.get("size")),
                item.get("crc32c"),
                item.get("timeCreated"),
                (item.get("metadata") or {}).get(PROGRESS_METADATA_KEY),
            )
            out.setdefault(f"{parts[0]}/{parts[1]}/{parts[2]}/", {})[parts[3]] = listed
    return out


def _int(value: Any) -> int | None:
    """The JSON API writes int64 values as strings (generation, size), as ``Blob.generation`` reads them."""
    return None if value is None else int(value)


def list_bucket(bucket: str, gcs: GcsJson | None = None) -> dict[str, dict[str, Listed]]:
    """Blocking: the bucket's stage objects, indexed by stage (one list call per glob and 1,000 objects).

    Indexed as the pages arrive, from the listing's JSON items as listed (no object per item beyond the small
    :class:`Listed`): only one page's items exist at a time, not the whole bucket's."""
    gcs = gcs or shared_gcs()
    pages = (
        gcs.list_pages(bucket, prefix=f"{ROOT}/", match_glob=glob, fields=fields)
        for glob, fields in zip(GLOBS, FIELDS, strict=True)
    )
    return index_by_stage(itertools.chain.from_iterable(itertools.chain.from_iterable(pages)))


_LISTER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="interlude-bucket-list")


async def list_bucket_async(bucket: str) -> dict[str, dict[str, Listed]]:
    """:func:`list_bucket` off the event loop, always in the same one worker thread.

    Why one thread of its own rather than ``asyncio.to_thread``: glibc gives threads that allocate at once
    their own malloc arenas and keeps what they freed there, so a listing that ran in whichever of the default
    executor's threads was free could leave its peak in each of their arenas; in one thread it reuses the
    same memory every interval (and is trimmed after each run, see :func:`release_free_memory`). Listings of
    several buckets queue behind each other: one call per bucket and interval, a fraction of a second each."""
    return await asyncio.get_running_loop().run_in_executor(_LISTER, _list_and_trim, bucket)


def _list_and_trim(bucket: str) -> dict[str, dict[str, Listed]]:
    index = list_bucket(bucket)
    release_free_memory()
    return index


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to ask
        return None


_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Hand the pages malloc holds free back to the OS (glibc ``malloc_trim``, every arena), once per listing.

    Why: each interval the trigger runner parses a zone's list of machines and the bucket's listing and drops
    the last ones; glibc keeps those freed pages inside its heaps, so the process's RSS stays at its highest
    peak plus fragmentation, and grew for minutes with 1,000 stages. A trim per interval costs ~1 ms.
    https://man7.org/linux/man-pages/man3/malloc_trim.3.html"""
    if _TRIM is not None:
        _TRIM(0)


def _generations(objects: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((name, blob.generation) for name, blob in objects.items()))


class StageFactsReader:
    """One stage's facts from the shared listing; downloads only what the listing shows has changed."""

    def __init__(self, bucket: str, run_key: str, stage: str, gcs: GcsJson | None = None) -> None:
        from interlude_workload import layout

        self.gcs = gcs
        self.bucket = bucket
        self.run_key = run_key
        self.stage = stage
        self.prefix = layout.stage_prefix(run_key, stage)
        self._progress: tuple[Any, dict[str, Any]] = (None, {})  # (generation, content)
        self._verdicts: dict[tuple[int, tuple[tuple[str, Any], ...]], bool] = {}  # committed step -> verifies
        self._ack: tuple[str, Any, Ack] | None = None  # (request id, generation, (step, when answered))
        self.downloads = 0

    def objects(self, index: BucketIndex) -> StageObjects:
        return index.get(self.prefix, {})

    def needs_io(self, objects: StageObjects, request_id: str | None) -> bool:
        """Whether :meth:`read` would download anything (else it is cheap enough for the event loop)."""
        progress = objects.get(PROGRESS)
        if progress is not None and progress.generation != self._progress[0] and progress.progress is None:
            return True
        ack = objects.get(_ack_name(request_id)) if request_id else None
        if ack is not None and (self._ack is None or self._ack[:2] != (request_id, ack.generation)):
            return True
        return self._committed(objects, verify=False) is None

    def read(self, objects: StageObjects, request_id: str | None) -> StageFacts:
        """The facts; downloads (blocking) only new progress, new acks and committed steps not yet verified."""
        committed = self._committed(objects, verify=True) or 0
        step, answered_at = self._read_ack(objects, request_id)
        return StageFacts(committed, self._read_progress(objects), step, answered_at, STAGE_MARKER in objects)

    def _download(self, name: str) -> bytes | None:
        """Blocking: one object by its full name (None: absent). Counted: the benchmark and tests read it."""
        self.downloads += 1
        return (self.gcs or shared_gcs()).download(self.bucket, name)

    def _committed(self, objects: StageObjects, verify: bool) -> int | None:
        """The highest committed step that verifies (0: none); None when verify is False and a step would
        need a download to decide."""
        verdicts: dict[tuple[int, tuple[tuple[str, Any], ...]], bool] = {}
        found = 0
        for status in reversed(step_statuses(objects.items())):
            if not status.committed:
                continue
            key = (status.step, _generations(status.objects))
            ok = self._verdicts.get(key)
            if ok is None:
                if not verify:
                    return None
                ok = self._verify(status)
                if ok is None:
                    continue  # a failed read is no verdict: try again next poll
            verdicts[key] = ok
            if ok:
                found = status.step
                break
        if verify:
            self._verdicts = verdicts  # only the steps still listed: the cache never outgrows the stage
        return found

    def _verify(self, status: Any) -> bool | None:
        """Whether a listed finalised step verifies (CheckpointStore.verify's metadata check: one download);
        None when it could not be read (gone since the listing, or GCS did not answer)."""
        if STEP_METADATA not in status.objects:
            return False  # "finalised, but _CHECKPOINT_METADATA is missing"
        try:
            metadata = self._download(status.objects[STEP_METADATA].name)
        except Exception:  # noqa: BLE001 - as CheckpointStore.verify: "could not read", no verdict
            return None
        if metadata is None:
            return None
        return check_finalised(status, metadata)[0] is not None

    def _json(self, relative: str) -> tuple[bool, dict[str, Any] | None]:
        """(read, content) of one of the stage's small JSON objects: (True, None) when it is absent or not a
        JSON object, (False, None) when GCS did not answer: the caller keeps what it knew and reads again at
        the next poll (an unanswered read is not "no progress")."""
        try:
            raw = self._download(self.prefix + relative)
        except Exception:  # noqa: BLE001 - no answer is not an answer
            return False, None
        return (True, None) if raw is None else _parse(raw)

    def _read_progress(self, objects: StageObjects) -> dict[str, Any]:
        blob = objects.get(PROGRESS)
        if blob is None:
            self._progress = (None, {})
        elif blob.generation != self._progress[0]:
            read, progress = _parse(blob.progress) if blob.progress is not None else self._json(PROGRESS)
            if read:
                self._progress = (blob.generation, progress or {})
        return self._progress[1]

    def _read_ack(self, objects: StageObjects, request_id: str | None) -> Ack:
        blob = objects.get(_ack_name(request_id)) if request_id else None
        if blob is None or request_id is None:
            return NO_ACK
        if self._ack is None or self._ack[:2] != (request_id, blob.generation):
            read, ack = self._json(_ack_name(request_id))
            if not read:
                return self._ack[2] if self._ack is not None and self._ack[0] == request_id else NO_ACK
            self._ack = (request_id, blob.generation, ack_of(ack))
        return self._ack[2]

    def with_new_progress(self, facts: StageFacts) -> StageFacts:
        """Blocking, one GET: ``facts`` (the last listing's) with progress.json read now (see :func:`with_progress`).
        The look of the short phase before a window where each moment counts (StageTrigger's quick watch): a hold
        must be seen within a fraction of its length, and a listing plus the downloads of the new step it shows
        took about as long as the hold itself."""
        read, progress = self._json(PROGRESS)
        return with_progress(facts, progress if read else None)


def with_progress(facts: StageFacts, progress: Mapping[str, Any] | None) -> StageFacts:
    """The facts with a newer progress.json (None: unreadable or absent, the facts stay as they were). The step
    the workload says it holds at counts as committed: it sets ``held_at`` only to a step Orbax has finalised
    (``Checkpointer.wait_while_held``), so the listing and downloads that would re-verify it are not needed to
    know it."""
    if progress is None:
        return facts
    committed, held = facts.committed_step, progress.get("held_at")
    if progress.get("state") == "holding" and isinstance(held, int) and not isinstance(held, bool):
        committed = max(committed, held)
    return StageFacts(committed, dict(progress), facts.request_ack_step, facts.request_ack_at, facts.export_committed)


def _parse(raw: str | bytes) -> tuple[bool, dict[str, Any] | None]:
    """(True, the JSON object) of a read; (True, None) when it is not a JSON object (a torn write elsewhere:
    treated as absent, as CheckpointStore._get_json does)."""
    try:
        value = json.loads(raw)
    except ValueError:
        return True, None
    return True, value if isinstance(value, dict) else None


def _ack_name(request_id: str | None) -> str:
    return f"control/ack-{request_id}.json"
