"""Orbax, as the workload uses it: one ``CheckpointManager`` per stage, Interlude's contract kept around it.

The SDK (interlude_workload.sdk) saves and restores through here; :class:`~interlude_workload.checkpoints.
CheckpointStore` imports this module only when asked to write or restore (the Airflow side never is). What Orbax does
is left to Orbax: the array I/O (tensorstore, OCDBT), finalisation (``commit_success.txt``), multi-host
coordination (its primary host writes the step metadata and markers, every host its own arrays, barriers between),
and async saves (``enable_async_checkpointing``). What is Interlude's:

* **Retention is not Orbax's** ``max_to_keep`` (the manager keeps everything; interlude_workload.retention prunes
  over the listing). Orbax 0.12 counts a step toward ``max_to_keep`` as soon as ``save()`` starts, before it is
  finalised, and its ``_finalize`` deletes the old steps even when the commit failed (``_finalize_checkpoint`` logs
  the error and returns; ``delete_steps`` runs after it): with ``max_to_keep=1``, or two failed async saves in a
  row, the latest finalised step is pruned. Its ``rmtree`` also removes a step's objects in listing order, so a
  half-deleted step keeps its ``commit_success.txt``. Interlude's retention never prunes the latest verified step,
  deletes markers first and stops on an unknown.
* **No** ``cleanup_tmp_directories``: on GCS it deletes every step directory Orbax does not see as finalised, and
  Orbax's view comes from fsspec's ``exists()``, which answers False for any error (a 403 included) - a finalised
  step would be deleted on an unknown. Leftovers of a save cut short are removed by Interlude's retention (below
  the latest only) and before a step is saved again (:func:`commit`).
* **Which step is the latest** comes from Interlude's listing (checkpoints.CheckpointStore.latest), not from
  ``manager.latest_step()``: the same fsspec answer would hide a finalised step that could not be read, and
  resuming from the one before would train over it.
* **Verified before restore**: the restore reads every array. A failure is a verdict only when GCS served the
  whole step (:func:`read_step`); anything else raises CheckpointUnreadable.
"""

from __future__ import annotations

from interlude_workload import orbax_env

orbax_env.configure_for_emulator()  # before tensorstore and gcsfs read their environment

import os  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
from collections.abc import Iterator, Mapping  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import orbax.checkpoint as ocp  # noqa: E402
from absl import logging as absl_logging  # noqa: E402

from interlude_workload import distributed, orbax_layout  # noqa: E402
from interlude_workload.checkpoints import (  # noqa: E402
    NOT_COMMITTED,
    Checkpoint,
    CheckpointStore,
    CheckpointUnreadable,
    CorruptCheckpoint,
    Rejection,
    WriteResult,
)
from interlude_workload.distributed import Workers  # noqa: E402
from interlude_workload.stage_files import short  # noqa: E402

# Orbax logs through absl, whose own handler was made (at absl's import) on whatever ``sys.stderr`` was then, and
# closes that stream when logging shuts handlers down, unless it is the current sys.stderr: a process that swaps
# sys.stderr (a test runner's capture, a log redirect) then has its stream closed under it by the next
# ``logging.config.dictConfig`` (Airflow's). The handler writes to the process's real stderr instead.
absl_logging.get_absl_handler().python_handler.setStream(sys.__stderr__)

STATE_ITEM = "state"  # the arrays (a pytree Orbax's StandardCheckpointHandler saves)
META_ITEM = "meta"  # the JSON side of a step (RNG state, data position): Orbax's JsonCheckpointHandler

# A failure that says GCS did not answer is an unknown at once, without the read-back that otherwise decides
# (read_step): tensorstore's status codes, an HTTP status in the message or on the exception (gcsfs's HttpError,
# google.api_core's), gcsfs's "Forbidden" (its 403), the socket layer's timeouts.
_UNKNOWN_STATUS = ("PERMISSION_DENIED", "UNAUTHENTICATED", "UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
_UNKNOWN_TEXT = re.compile(
    r"(?:response code|status(?: code)?|code)[:= ]+(?:401|403|408|429|5\d\d)\b|^Forbidden|timed out|Timeout",
    re.IGNORECASE,
)
_UNKNOWN_CODES = frozenset({401, 403, 408, 429})
_UNKNOWN_TYPES = re.compile(r"Connect|Timeout|Disconnect|ProxyError")  # requests', aiohttp's, urllib3's


@dataclass(frozen=True)
class Restored:
    """A verified step read back: Orbax's items (the SDK's: ``state`` arrays and ``meta`` JSON)."""

    checkpoint: Checkpoint
    items: dict[str, Any]

    @property
    def step(self) -> int:
        return self.checkpoint.step

    @property
    def state(self) -> Any:
        return self.items.get(STATE_ITEM)

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.items.get(META_ITEM) or {})


GOOGLE_STORAGE = "https://storage.googleapis.com"
_BOUND_ENV = (orbax_env.EMULATOR_ENV, *orbax_env.environment_for(GOOGLE_STORAGE))


def bind(store: CheckpointStore) -> None:
    """Point Orbax's clients (tensorstore, gcsfs) at the GCS the store's client talks to.

    Why: Orbax takes its endpoint from the environment (orbax_env), the store from its client; a store made with
    an explicit client (a tool, a test, a local cloud's) must not have its arrays land elsewhere. tensorstore reads
    ``TENSORSTORE_GCS_HTTP_URL`` when it opens a store, gcsfs ``STORAGE_EMULATOR_HOST`` on each request."""
    endpoint = str(getattr(store.client, "api_endpoint", "") or "").rstrip("/")
    if endpoint and endpoint != GOOGLE_STORAGE:
        os.environ[orbax_env.EMULATOR_ENV] = endpoint
    elif endpoint == GOOGLE_STORAGE:
        for name in _BOUND_ENV:
            os.environ.pop(name, None)
    orbax_env.configure_for_emulator()
    forget_listings()  # what gcsfs remembers (listings, object details with their URLs) may be another GCS's


@contextmanager
def bound_to(store: CheckpointStore) -> Iterator[None]:
    """:func:`bind` for the duration of a one-off operation; the environment is as it was afterwards."""
    saved = {name: os.environ.get(name) for name in _BOUND_ENV}
    bind(store)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def open_manager(store: CheckpointStore, *, async_saves: bool = False, read_only: bool = False) -> Any:
    """The stage's ``ocp.CheckpointManager`` with Interlude's options (see the module docstring for why); call
    :func:`bind` (or be inside :func:`bound_to`) first when the store's client is not the environment's."""
    options = ocp.CheckpointManagerOptions(
        # Several workers: each writes its part of every step (Orbax 0.12 splits even replicated arrays' bytes
        # between them: state/ocdbt.process_N/, state/array_metadatas/process_N), Orbax's own barriers between, and
        # the primary host (worker 0) writes the step's metadata and commit marker once every part is in. With one
        # process these are Orbax's defaults.
        multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=0),
        max_to_keep=None,
        cleanup_tmp_directories=False,
        enable_async_checkpointing=async_saves,
        create=not read_only,
        read_only=read_only,
    )
    return ocp.CheckpointManager(store.checkpoints_uri, options=options)


def save(
    manager: Any,
    step: int,
    state: Any,
    *,
    meta: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    reason: str = "",
    wait: bool = True,
) -> None:
    """``manager.save(step, force=True)`` of the state and its JSON side; Interlude's facts in the step metadata.

    ``wait``: return only once Orbax finalised the step (what a notice, a request or SIGTERM needs); False lets an
    async manager finish it in the background (the next save waits for it, as Orbax does)."""
    facts = {"metrics": dict(metrics or {}), "extra": dict(extra or {}), "reason": reason}
    args = ocp.args.Composite(
        **{STATE_ITEM: ocp.args.StandardSave(state), META_ITEM: ocp.args.JsonSave(dict(meta or {}))}
    )
    manager.save(
        step,
        args=args,
        force=True,
        metrics=dict(metrics or {}),
        custom_metadata={orbax_layout.INTERLUDE_KEY: facts},
    )
    if wait:
        manager.wait_until_finished()


def commit(
    store: CheckpointStore,
    manager: Any,
    step: int,
    state: Any,
    *,
    meta: Mapping[str, Any] | None = None,
    metrics: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    reason: str = "",
    wait: bool = True,
    proven_bad: frozenset[int] = frozenset(),
    workers: Workers | None = None,
) -> WriteResult | None:
    """Save ``step`` unless it is committed already; the committed checkpoint (None: an async save in flight).

    A finalised step that verifies is kept (``written`` False), unless a restore in this process proved it bad
    (``proven_bad``); an unfinished leftover (a save cut short) or a proven-bad step is deleted, markers first,
    and saved again. An unknown raises :class:`CheckpointUnreadable` before anything is deleted or written.

    Several ``workers``: worker 0 (Orbax's primary host) decides and deletes, every worker learns its decision in
    one agreement round and then saves (Orbax's save is collective: its barriers wait for every worker)."""
    kept = None
    if workers is None or workers.primary:
        kept = _keep_or_clear(store, manager, step, proven_bad)
    if workers is not None and workers.multi:
        keep = distributed.gather(int(kept is not None))[0]
        forget_listings()
        manager.reload()
        if keep and kept is None:
            return committed_result(store, step, written=False)
    if kept is not None:
        return WriteResult(checkpoint=kept, written=False)
    save(manager, step, state, meta=meta, metrics=metrics, extra=extra, reason=reason, wait=wait)
    return committed_result(store, step) if wait else None


def _keep_or_clear(store: CheckpointStore, manager: Any, step: int, proven_bad: frozenset[int]) -> Checkpoint | None:
    """``step`` when it is committed and verifies (keep it); else None, after deleting what a save left of it."""
    existing = store.scan_step(step)
    if existing is None:
        return None
    if existing.committed and step not in proven_bad:
        checkpoint, _why = store.verify(existing)
        if checkpoint is not None:
            return checkpoint
    store.delete_step(existing)
    forget_listings()
    manager.reload()  # Orbax's view of the steps, without the one just deleted
    return None


def forget_listings() -> None:
    """Drop the listings gcsfs remembers for Orbax (etils.epath keeps one file system per process, and gcsfs keeps
    its listings until its own calls change them): after Interlude deleted objects with its own client, Orbax would
    otherwise see the step still there, and its ``save(force=True)`` rmtree of it fail on the missing objects."""
    from etils.epath import backend

    backend.fsspec_backend.fs("gs://bucket").invalidate_cache()


def committed_result(store: CheckpointStore, step: int, *, written: bool = True) -> WriteResult:
    """The finalised ``step`` as GCS lists it now (one list, one small download); raises if it is not."""
    status = store.scan_step(step)
    if status is None or not status.committed:
        raise RuntimeError(f"{store.uri(step)}: Orbax returned, but the step is not finalised")
    checkpoint, why = store.verify(status)
    if checkpoint is None:
        raise RuntimeError(f"{store.uri(step)}: Orbax returned, but the step does not verify: {why}")
    return WriteResult(checkpoint=checkpoint, written=written)


def _args(target: Any, items: bool) -> Any:
    if not items:
        return None
    return ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(target), META_ITEM: ocp.args.JsonRestore()})


def _restore(manager: Any, step: int, target: Any, sdk_items: bool) -> dict[str, Any]:
    try:
        restored = manager.restore(step, args=_args(target, sdk_items))
    except ValueError as exc:
        if target is not None or not sdk_items or "Topology mismatch" not in str(exc):
            raise
        # A step saved by several workers (its arrays sharded or replicated over a mesh of all their devices), read
        # "as saved" by one process (the control plane's full verification, a one-worker resume): Orbax refuses
        # the saved sharding here. The same arrays onto this process's first device instead.
        restored = manager.restore(step, args=_args(_local_target(manager, step), sdk_items))
    return {name: restored[name] for name in restored.keys()}


def _local_target(manager: Any, step: int) -> Any:
    """The SDK's state item of ``step`` as an abstract tree (shapes and dtypes from Orbax's metadata) on this
    process's first device."""
    import jax

    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    saved = manager.item_metadata(step)[STATE_ITEM]
    return jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), saved)


def _is_unknown(exc: BaseException) -> bool:
    """Whether a failure (or one it was raised from) says GCS did not answer."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, (ConnectionError, TimeoutError, CheckpointUnreadable)):
            return True
        if _UNKNOWN_TYPES.search(type(seen).__name__):
            return True
        code = getattr(seen, "code", None)
        if isinstance(code, int) and (code in _UNKNOWN_CODES or code >= 500):
            return True
        text = str(seen)
        if any(word in text for word in _UNKNOWN_STATUS) or _UNKNOWN_TEXT.search(text):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _served_whole(store: CheckpointStore, step: int) -> str | None:
    """Download every object of a step with the plain GCS client: None when all came back, the missing one's
    name when GCS said 404 (a verdict); CheckpointUnreadable when it did not answer."""
    status = store.scan_step(step)
    if status is None or not status.committed:
        return f"deleted since the listing ({orbax_layout.COMMIT_SUCCESS} gone)"
    for name in sorted(status.objects):
        if store.read_listed(status, name) is None:
            return f"{name} is gone"
    return None


def read_step(
    store: CheckpointStore, checkpoint: Checkpoint, manager: Any = None, target: Any = None
) -> dict[str, Any]:
    """Restore one verified step, every array read; CorruptCheckpoint only when a successful read proved it bad.

    Why a read-back decides: Orbax's errors do not say whether the bytes or the network failed. When a restore
    fails and GCS then serves every object of the step (plain downloads), and Orbax still cannot restore what it
    was served (untargeted, as saved), the bytes are bad; if it can, a ``target`` that does not fit the step was
    the problem (a ValueError: no fallback, nothing deleted). A failed download is an unknown.
    """
    own = manager is None
    manager = manager or open_manager(store, read_only=True)
    sdk_items = _has_sdk_items(checkpoint)
    try:
        try:
            return _restore(manager, checkpoint.step, target, sdk_items)
        except Exception as exc:  # noqa: BLE001 - decided below: verdict or unknown
            first = exc
        if _is_unknown(first):
            raise CheckpointUnreadable(f"{checkpoint.uri}: {short(first)}") from first
        missing = _served_whole(store, checkpoint.step)
        if missing is not None:
            raise CorruptCheckpoint(f"{checkpoint.uri}: {missing}") from first
        try:
            restored = _restore(manager, checkpoint.step, None, sdk_items)
        except Exception as exc:
            if _is_unknown(exc):
                raise CheckpointUnreadable(f"{checkpoint.uri}: {short(exc)}") from exc
            raise CorruptCheckpoint(f"{checkpoint.uri}: Orbax cannot restore it: {short(first)}") from first
        if target is None:
            return restored  # the first failure did not come back: it was not the bytes
        raise ValueError(f"{checkpoint.uri} restores, but not into the given target: {short(first)}") from first
    finally:
        if own:
            manager.close()


def _has_sdk_items(checkpoint: Checkpoint) -> bool:
    handlers = checkpoint.metadata.get("item_handlers")
    return isinstance(handlers, dict) and set(handlers) == {STATE_ITEM, META_ITEM}


def restore_latest(
    store: CheckpointStore, manager: Any = None, target: Any = None
) -> tuple[Restored | None, list[Rejection]]:
    """The latest finalised step that verifies and restores, past any that a successful read proved bad.

    Raises :class:`CheckpointUnreadable` on an unknown: falling back past an unreadable step would resume from an
    older one and then train over (rewrite) a committed step."""
    rejected: list[Rejection] = []
    own = manager is None
    manager = manager or open_manager(store, read_only=True)
    try:
        for status in reversed(store.scan()):
            if not status.committed:
                rejected.append(Rejection(status.step, NOT_COMMITTED, corrupt=False))
                continue
            checkpoint, why = store.verify(status)
            if checkpoint is None:
                rejected.append(Rejection(status.step, why or "unknown", corrupt=True))
                continue
            try:
                return Restored(checkpoint, read_step(store, checkpoint, manager, target)), rejected
            except CorruptCheckpoint as exc:
                rejected.append(Rejection(status.step, str(exc), corrupt=True))
        return None, rejected
    finally:
        if own:
            manager.close()
