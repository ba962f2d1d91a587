"""The object store of one cluster: objects, a cluster-wide resourceVersion and watch fan-out.

Like etcd behind the API server, every write gets the next resourceVersion, and a watch from
resourceVersion N replays the retained history after N (410 Gone when N is older than the history),
then streams live events (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes).
Every write passes the validator first, so nothing invalid is ever stored, whoever writes it.
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
Key = tuple[str, str, str]  # (plural.group, namespace or "", name)
HISTORY = 20_000


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED
    rt: ResourceType
    namespace: str
    object: Obj
    rv: int


@dataclass
class _Watcher:
    rt: ResourceType
    namespace: str | None
    push: Callable[[WatchEvent], None]


class Store:
    def __init__(self, validator: Validator) -> None:
        self.validator = validator
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

    def _emit(self, etype: str, rt: ResourceType, namespace: str, obj: Obj) -> None:
        ev = WatchEvent(etype, rt, namespace, copy.deepcopy(obj), self._rv)
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
    def create(self, rt: ResourceType, namespace: str, obj: Obj) -> Obj:
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
            self._bump(obj)
            self._objects[key] = obj
            self._emit("ADDED", rt, namespace, obj)
            return copy.deepcopy(obj)

    def update(
        self, rt: ResourceType, namespace: str, name: str, mutate: Callable[[Obj], Obj], subresource: str = ""
    ) -> Obj:
        """Replace an object with mutate(current copy); keeps identity, checks resourceVersion, bumps it.

        The main resource ignores status changes and `/status` ignores everything else, as the API
        server does for kinds with a status subresource.
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
            for k in ("uid", "creationTimestamp", "name", "namespace", "generation"):
                if k in cur["metadata"]:
                    meta[k] = cur["metadata"][k]
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
            if new == cur:
                return copy.deepcopy(cur)
            if rt.generation and _spec_of(new) != _spec_of(cur):
                meta["generation"] = int(cur["metadata"].get("generation", 1)) + 1
            meta["resourceVersion"] = str(self._rv + 1)
            self.validator(rt, new)
            self._bump(new)
            self._objects[key] = new
            self._emit("MODIFIED", rt, namespace, new)
            return copy.deepcopy(new)

    def delete(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        with self.lock:
            obj = self._objects.pop(self._key(rt, namespace, name), None)
            if obj is None:
                raise status.not_found(rt, name)
            self._bump(obj)
            self._emit("DELETED", rt, namespace, obj)
            if rt.plural == "namespaces":
                for k in [k for k in self._objects if k[1] == name]:
                    inner = next(r for r in RESOURCES if r.qualified == k[0])
                    self.delete(inner, name, k[2])
            return copy.deepcopy(obj)

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
