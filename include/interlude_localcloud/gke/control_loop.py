"""A controller thread over one cluster's store: woken by the watch events it cares about, else every second.

What kube-controller-manager's controllers do with informers, in-process: `wants(event)` filters the
store's events (so status churn does not wake a controller that ignores it), `reconcile()` runs a pass
over the current objects; a pass that raced another writer is simply run again. Used as is by the garbage
collector and the Endpoints controller, and as the base of the Job and JobSet controllers, with the
owner-reference bookkeeping those two share. Deleting what an owner leaves behind is the garbage
collector's job alone (`garbage_collector.py`): a controller only writes controller references.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from interlude_localcloud.gke.resources import ResourceType
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store, WatchEvent


class ControlLoop:
    def __init__(
        self,
        store: Store,
        kinds: Iterable[ResourceType],
        reconcile: Callable[[], None],
        name: str,
        wants: Callable[[WatchEvent], bool] = lambda _ev: True,
        period: float = 1.0,
    ) -> None:
        self.store = store
        self.kinds = tuple(kinds)
        self.reconcile = reconcile
        self.name = name
        self.wants = wants
        self.period = period
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: list[Callable[[], None]] = []

    def _poke(self, ev: WatchEvent) -> None:
        if self.wants(ev):
            self._wake.set()

    def start(self) -> None:
        for rt in self.kinds:
            _, unsubscribe = self.store.watch(rt, None, self.store.resource_version, self._poke)
            self._unsubscribe.append(unsubscribe)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        self._wake.set()  # a first pass over what exists at start
        while not self._stop.is_set():
            self._wake.wait(timeout=self.period)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.reconcile()
            except KubeError:  # raced with another writer: run again
                self._wake.set()

    # what the Job and JobSet controllers write ----------------------------------------------
    def delete(self, rt: ResourceType, obj: dict[str, Any], propagation: str = "Background") -> None:
        """Delete a dependent the controller itself no longer wants (not one whose owner went: that is the
        garbage collector's); one already being deleted is left to finish."""
        if deleting(obj):
            return
        try:
            self.store.remove(rt, obj["metadata"].get("namespace") or "", obj["metadata"]["name"], propagation)
        except KubeError:
            pass

    def write_status(self, rt: ResourceType, obj: dict[str, Any], status: dict[str, Any]) -> None:
        if obj.get("status") == status:
            return

        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            cur["status"] = status
            cur["metadata"].pop("resourceVersion", None)
            return cur

        try:
            self.store.update(rt, obj["metadata"]["namespace"], obj["metadata"]["name"], mutate, "status")
        except KubeError:
            self._wake.set()


def meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """A controller reference (what controllerutil.SetControllerReference writes): the garbage collector
    deletes the dependent with its owner, and a Foreground delete of the owner waits for it."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def controller_uid(obj: dict[str, Any], kind: str) -> str | None:
    for ref in obj["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def deleting(obj: dict[str, Any]) -> bool:
    """The object is being deleted (a Foreground delete leaves it with a deletionTimestamp until its
    dependents are gone): a controller makes no new dependents for it."""
    return bool(meta(obj).get("deletionTimestamp"))
