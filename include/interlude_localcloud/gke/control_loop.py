"""A controller's loop over the store: woken by writes to the kinds it watches (else every second), it runs
`reconcile_all` in its own thread, as each kube-controller-manager controller runs its own workers.
Shared by the Job and JobSet controllers; also the owner-reference bookkeeping they both need."""

from __future__ import annotations

import threading
from typing import Any

from interlude_localcloud.gke.resources import ResourceType
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store, WatchEvent


class ControlLoop:
    name = "controller"
    watches: tuple[ResourceType, ...] = ()

    def __init__(self, store: Store) -> None:
        self.store = store
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: list[Any] = []

    def _poke(self, _ev: WatchEvent) -> None:
        self._wake.set()

    def start(self) -> None:
        for rt in self.watches:
            _, unsubscribe = self.store.watch(rt, None, self.store.resource_version, self._poke)
            self._unsubscribe.append(unsubscribe)
        self._thread = threading.Thread(target=self._run, name=f"gke-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=1.0)
            self._wake.clear()
            if not self._stop.is_set():
                try:
                    self.reconcile_all()
                except KubeError:  # raced with another writer: the next event retries
                    self._wake.set()

    def reconcile_all(self) -> None:
        raise NotImplementedError

    def delete(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        try:
            self.store.delete(rt, obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
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
    return bool(obj["metadata"].get("deletionTimestamp"))


def orphaned(obj: dict[str, Any], kind: str, owners: dict[str, dict[str, Any]]) -> bool:
    """The garbage collector's rule for a dependent: its controller owner is gone, or is being deleted in the
    foreground (`foregroundDeletion` finalizer). An Orphan delete removes the owner reference instead, so
    such a dependent has no owner here and is kept."""
    uid = controller_uid(obj, kind)
    if uid is None:
        return False
    owner = owners.get(uid)
    if owner is None:
        return True
    return deleting(owner) and "foregroundDeletion" in (owner["metadata"].get("finalizers") or [])
