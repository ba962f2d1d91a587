"""The object store of one cluster: objects, a cluster-wide resourceVersion and watch fan-out.

Like etcd behind the API server, every write gets the next resourceVersion, and a watch from
resourceVersion N replays the retained history after N (410 Gone when N is older than the history),
then streams live events (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes).
Every write passes the validator first, so nothing invalid is ever stored, whoever writes it.
`dry_run` writes are checked and answered but neither stored nor seen by watchers
(https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run). An object with finalizers is not
removed by a delete: it gets `deletionTimestamp` and goes when an update empties its finalizers
(https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/); `propagation` adds the
garbage collector's `foregroundDeletion` / `orphan` finalizer
(https://kubernetes.io/docs/concepts/architecture/garbage-collection/#cascading-deletion).
"""

from __future__ import annotations

import copy
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from interlude_localcloud.gke import status
from interlude_localcloud.gke.resources import RESOURCES, ResourceType

Obj = dict[str, Any]
Validator = Callable[[ResourceType, Obj], None]
UpdateValidator = Callable[[ResourceType, Obj, Obj], None]  # (rt, old, new): immutable fields and the like
Key = tuple[str, str, str]  # (plural.group, namespace or "", name)
HISTORY = 20_000
FOREGROUND, ORPHAN = "foregroundDeletion", "orphan"  # the garbage collector's finalizers
_KEPT_ON_UPDATE = (
    "uid",
    "creationTimestamp",
    "name",
    "namespace",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED
    rt: ResourceType
    namespace: str
    object: Obj
    rv: int
    prev: Obj | None = None  # the object before this event (MODIFIED, DELETED): what a selective watch compares


@dataclass
class _Watcher:
    rt: ResourceType
    namespace: str | None
    push: Callable[[WatchEvent], None]


class Store:
    def __init__(self, validator: Validator, update_validator: UpdateValidator | None = None) -> None:
        self.validator = validator
        self.update_validator = update_validator
        self.lock = threading.RLock()
        self._rv = 1
        self._objects: dict[Key, Obj] = {}
        self._history: deque[WatchEvent] = deque(maxlen=HISTORY)
        self._watchers: list[_Watcher] = []
        self.logs: dict[tuple[str, str], list[str]] = {}  # (namespace, pod) -> container output lines
        self.ended_logs: set[tuple[str, str]] = set()  # pods whose containers are gone: their log is complete

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    @staticmethod
    def _key(rt: ResourceType, namespace: str, name: str) -> Key:
        return (rt.qualified, namespace if rt.namespaced else "", name)

    def _emit(self, etype: str, rt: ResourceType, namespace: str, obj: Obj, prev: Obj | None = None) -> None:
        ev = WatchEvent(etype, rt, namespace, copy.deepcopy(obj), self._rv, copy.deepcopy(prev))
        self._history.append(ev)
        for w in list(self._watchers):
            if w.rt == rt and (w.namespace is None or w.namespace == namespace):
                w.push(ev)

    def _bump(self, obj: Obj) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    def append_log(self, namespace: str, pod: str, line: str) -> None:
        """Container output for `pods/{name}/log` (written by whatever runs the pod's containers)."""
        with self.lock:
            self.logs.setdefault((namespace, pod), []).append(line)

    def end_log(self, namespace: str, pod: str) -> None:
        """The pod's containers are gone and their output read: a `follow` stream of its log ends."""
        with self.lock:
            self.ended_logs.add((namespace, pod))

    # reads ---------------------------------------------------------------------------------
    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        with self.lock:
            obj = self._objects.get(self._key(rt, namespace, name))
            if obj is None:
                raise status.not_found(rt, name)
            return copy.deepcopy(obj)

    def list(
        self, rt: ResourceType, namespace: str | None, pred: Callable[[Obj], bool] = lambda _o: True
    ) -> tuple[list[Obj], str]:
        with self.lock:
            items = [
                copy.deepcopy(o)
                for (q, ns, _), o in sorted(self._objects.items())
                if q == rt.qualified and (namespace is None or ns == namespace) and pred(o)
            ]
            return items, self.resource_version

    def exists(self, rt: ResourceType, namespace: str, name: str) -> bool:
        with self.lock:
            return self._key(rt, namespace, name) in self._objects

    # writes --------------------------------------------------------------------------------
    def create(self, rt: ResourceType, namespace: str, obj: Obj, dry_run: bool = False) -> Obj:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name") or ""
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if rt.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=now())
        for k in ("resourceVersion", "deletionTimestamp", "selfLink"):
            meta.pop(k, None)
        if rt.generation:
            meta["generation"] = 1
        with self.lock:
            key = self._key(rt, namespace, name)
            if key in self._objects:
                raise status.already_exists(rt, name)
            if rt.namespaced and not self.exists(_NAMESPACES, "", namespace):
                raise status.KubeError(
                    404, "NotFound", f'namespaces "{namespace}" not found', {"name": namespace, "kind": "namespaces"}
                )
            meta["resourceVersion"] = str(self._rv + 1)
            self.validator(rt, obj)
            if dry_run:  # as the API server answers it: defaulted, validated, no resourceVersion (never stored)
                meta.pop("resourceVersion")
                return copy.deepcopy(obj)
            self._bump(obj)
            self._objects[key] = obj
            self._emit("ADDED", rt, namespace, obj)
            return copy.deepcopy(obj)

    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        mutate: Callable[[Obj], Obj],
        subresource: str = "",
        dry_run: bool = False,
    ) -> Obj:
        """Replace an object with mutate(current copy); keeps identity, checks resourceVersion, bumps it.

        The main resource ignores status changes and `/status` ignores everything else, as the API
        server does for kinds with a status subresource. An object being deleted takes no new finalizer,
        and goes once its last finalizer is removed.
        """
        with self.lock:
            key = self._key(rt, namespace, name)
            cur = self._objects.get(key)
            if cur is None:
                raise status.not_found(rt, name)
            new = mutate(copy.deepcopy(cur))
            meta = new.setdefault("metadata", {})
            sent_rv = meta.get("resourceVersion")
            if sent_rv and sent_rv != cur["metadata"]["resourceVersion"]:
                raise status.conflict(
                    rt,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
            new = _merge_subresource(cur, new, subresource, "status" in rt.subresources)
            meta = new["metadata"]
            for k in _KEPT_ON_UPDATE:
                if k in cur["metadata"]:
                    meta[k] = cur["metadata"][k]
                else:
                    meta.pop(k, None)
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
            if new == cur:
                return copy.deepcopy(cur)
            if rt.generation and _spec_of(new) != _spec_of(cur):
                meta["generation"] = int(cur["metadata"].get("generation", 1)) + 1
            meta["resourceVersion"] = str(self._rv + 1)
            self.validator(rt, new)
            _check_finalizers(rt, cur, new)
            if self.update_validator is not None:
                self.update_validator(rt, cur, new)
            if dry_run:
                meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
                return copy.deepcopy(new)
            self._bump(new)
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                del self._objects[key]  # the last finalizer is gone: the deletion completes
                self._emit("DELETED", rt, namespace, new, cur)
                return copy.deepcopy(new)
            self._objects[key] = new
            self._emit("MODIFIED", rt, namespace, new, cur)
            return copy.deepcopy(new)

    def delete(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        """Delete with the default (Background) propagation; the object as deleted or as now being deleted."""
        return self.remove(rt, namespace, name)[0]

    def remove(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        propagation: str = "Background",
        dry_run: bool = False,
        preconditions: dict[str, str] | None = None,
    ) -> tuple[Obj, bool]:
        """Delete an object: (its last state, whether it is gone now).

        Foreground and Orphan put the garbage collector's finalizer on it; any finalizer keeps it,
        marked with `deletionTimestamp`, until the finalizers are removed. Background drops both.
        """
        with self.lock:
            key = self._key(rt, namespace, name)
            cur = self._objects.get(key)
            if cur is None:
                raise status.not_found(rt, name)
            _check_preconditions(rt, cur, preconditions or {})
            finalizers = [f for f in cur["metadata"].get("finalizers") or [] if f not in (FOREGROUND, ORPHAN)]
            if propagation == "Foreground":
                finalizers.append(FOREGROUND)
            elif propagation == "Orphan":
                finalizers.append(ORPHAN)
            if not finalizers:
                if dry_run:
                    return copy.deepcopy(cur), True
                obj = self._objects.pop(key)
                self._bump(obj)
                self._emit("DELETED", rt, namespace, obj, cur)
                if rt.plural == "namespaces":
                    for k in [k for k in self._objects if k[1] == name]:
                        inner = next(r for r in RESOURCES if r.qualified == k[0])
                        self.delete(inner, name, k[2])
                return copy.deepcopy(obj), True
            new = copy.deepcopy(cur)
            new["metadata"].setdefault("deletionTimestamp", now())
            new["metadata"].setdefault("deletionGracePeriodSeconds", 0)
            new["metadata"]["finalizers"] = finalizers
            if dry_run or new == cur:
                return new, False
            self._bump(new)
            self._objects[key] = new
            self._emit("MODIFIED", rt, namespace, new, cur)
            return copy.deepcopy(new), False

    def compact(self) -> None:
        """Forget the watch history, as etcd's periodic compaction does: older resourceVersions are Gone."""
        with self.lock:
            self._history.clear()

    # watch ---------------------------------------------------------------------------------
    def watch(
        self, rt: ResourceType, namespace: str | None, since: str | None, push: Callable[[WatchEvent], None]
    ) -> tuple[list[WatchEvent], Callable[[], None]]:
        """Register push() for live events; return the events to send first and an unsubscribe.

        No resourceVersion (or "0"): synthetic ADDED events for the current objects. resourceVersion N:
        the retained events after N, or 410 Gone when N predates the retained history.
        """
        with self.lock:
            if not since or since == "0":
                items, _ = self.list(rt, namespace)
                first = [WatchEvent("ADDED", rt, (o["metadata"].get("namespace") or ""), o, self._rv) for o in items]
            else:
                try:
                    rv = int(since)
                except ValueError as e:
                    raise status.bad_request(f"invalid resource version {since!r}") from e
                oldest = self._history[0].rv if self._history else self._rv + 1
                if rv < oldest - 1 and rv < self._rv:
                    raise status.gone(f"too old resource version: {rv} ({oldest - 1})")
                first = [
                    e
                    for e in self._history
                    if e.rv > rv and e.rt == rt and (namespace is None or e.namespace == namespace)
                ]
            w = _Watcher(rt, namespace, push)
            self._watchers.append(w)

        def unsubscribe() -> None:
            with self.lock:
                if w in self._watchers:
                    self._watchers.remove(w)

        return first, unsubscribe

    def objects(self) -> Iterator[tuple[ResourceType, Obj]]:
        """Every stored object (for checks: e.g. that all of them validate)."""
        with self.lock:
            snapshot = list(self._objects.items())
        for (q, _, _), obj in snapshot:
            yield next(r for r in RESOURCES if r.qualified == q), copy.deepcopy(obj)


_NAMESPACES = RESOURCES[0]


def _check_preconditions(rt: ResourceType, cur: Obj, preconditions: dict[str, str]) -> None:
    """DeleteOptions.preconditions: the uid / resourceVersion the deleter expects, else 409 Conflict."""
    for field, value in preconditions.items():
        if value and cur["metadata"].get(field) != value:
            label = "UID" if field == "uid" else "ResourceVersion"
            raise status.conflict(
                rt,
                cur["metadata"]["name"],
                f"Precondition failed: {label} in precondition: {value}, "
                f"{label} in object meta: {cur['metadata'].get(field)}",
            )


def _check_finalizers(rt: ResourceType, cur: Obj, new: Obj) -> None:
    """No finalizer may be added to an object being deleted (the API server's ValidateObjectMetaUpdate)."""
    if not cur["metadata"].get("deletionTimestamp"):
        return
    added = [f for f in new["metadata"].get("finalizers") or [] if f not in (cur["metadata"].get("finalizers") or [])]
    if added:
        listed = ", ".join(f'"{f}"' for f in added)
        raise status.invalid(
            rt,
            cur["metadata"]["name"],
            [
                {
                    "reason": "FieldValueForbidden",
                    "field": "metadata.finalizers",
                    "message": "Forbidden: no new finalizers can be added if the object is being deleted, "
                    f"found new finalizers []string{{{listed}}}",
                }
            ],
        )


def _spec_of(obj: Obj) -> Any:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _merge_subresource(cur: Obj, new: Obj, subresource: str, has_status: bool) -> Obj:
    if not has_status or subresource == "binding":
        return new
    if subresource == "status":
        out = copy.deepcopy(cur)
        if "status" in new:
            out["status"] = new["status"]
        else:
            out.pop("status", None)
        out["metadata"]["resourceVersion"] = new["metadata"].get("resourceVersion", cur["metadata"]["resourceVersion"])
        return out
    if "status" in cur:
        new["status"] = cur["status"]
    else:
        new.pop("status", None)
    return new
