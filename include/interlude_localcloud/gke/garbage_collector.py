"""The garbage collector: owners' `foregroundDeletion` / `orphan` finalizers and dependents left ownerless.

As https://kubernetes.io/docs/concepts/architecture/garbage-collection/ describes it:
- Foreground: the owner stays (`deletionTimestamp`, finalizer `foregroundDeletion`) while its dependents
  are deleted; once no dependent with `ownerReferences[].blockOwnerDeletion: true` is left, the finalizer
  goes and with it the owner. A dependent that has dependents of its own is deleted in the foreground too.
- Orphan: the dependents lose their ownerReference to the owner, then the `orphan` finalizer goes.
- Background (the default): the owner is gone at once; a dependent none of whose owners exists any more is
  deleted, one that still has an owner only loses the references to the gone ones. A reference to a kind
  this server does not serve is left alone (the real collector cannot resolve it either).
"""

from __future__ import annotations

from typing import Any

from interlude_localcloud.gke import resources
from interlude_localcloud.gke.control_loop import ControlLoop, meta
from interlude_localcloud.gke.resources import RESOURCES, ResourceType
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import FOREGROUND, ORPHAN, Store, WatchEvent

Obj = dict[str, Any]


def _wants(ev: WatchEvent) -> bool:
    """Only what can start or finish a collection: deletions, objects being deleted, new or changed owners."""
    if ev.type == "DELETED" or meta(ev.object).get("deletionTimestamp"):
        return True
    refs = meta(ev.object).get("ownerReferences")
    return bool(refs) and (ev.prev is None or refs != meta(ev.prev).get("ownerReferences"))


def _remove(store: Store, rt: ResourceType, obj: Obj, policy: str) -> bool:
    """Delete a dependent; whether it is gone."""
    try:
        return store.remove(rt, meta(obj).get("namespace") or "", meta(obj)["name"], policy)[1]
    except KubeError:  # already gone
        return True


def _update(store: Store, rt: ResourceType, obj: Obj, change: Any) -> None:
    def mutate(cur: Obj) -> Obj:
        change(cur["metadata"])
        cur["metadata"].pop("resourceVersion", None)
        return cur

    try:
        store.update(rt, meta(obj).get("namespace") or "", meta(obj)["name"], mutate)
    except KubeError:  # gone meanwhile: nothing left to change
        pass


def _drop_owners(store: Store, rt: ResourceType, obj: Obj, uids: set[str]) -> None:
    def change(m: Obj) -> None:
        refs = [r for r in m.get("ownerReferences") or [] if r.get("uid") not in uids]
        if refs:
            m["ownerReferences"] = refs
        else:
            m.pop("ownerReferences", None)

    _update(store, rt, obj, change)


def _drop_finalizer(store: Store, rt: ResourceType, obj: Obj, finalizer: str) -> None:
    def change(m: Obj) -> None:
        m["finalizers"] = [f for f in m.get("finalizers") or [] if f != finalizer]

    _update(store, rt, obj, change)


def collect(store: Store) -> None:
    """One pass of the collector over every object of the cluster."""
    objs = list(store.objects())
    uids = {meta(o)["uid"] for _, o in objs}
    dependents: dict[str, list[tuple[ResourceType, Obj]]] = {}
    for rt, o in objs:
        for ref in meta(o).get("ownerReferences") or []:
            dependents.setdefault(ref.get("uid"), []).append((rt, o))
    for rt, o in objs:
        m = meta(o)
        finalizers = m.get("finalizers") or []
        if not m.get("deletionTimestamp"):
            continue
        deps = dependents.get(m["uid"], [])
        if ORPHAN in finalizers:
            for drt, d in deps:
                _drop_owners(store, drt, d, {m["uid"]})
            _drop_finalizer(store, rt, o, ORPHAN)
        elif FOREGROUND in finalizers:
            blocking = False
            for drt, d in deps:
                gone = False  # a dependent already being deleted still blocks until it is gone
                if not meta(d).get("deletionTimestamp"):
                    policy = "Foreground" if dependents.get(meta(d)["uid"]) else "Background"
                    gone = _remove(store, drt, d, policy)
                refs = [r for r in meta(d).get("ownerReferences") or [] if r.get("uid") == m["uid"]]
                blocking |= not gone and any(r.get("blockOwnerDeletion") for r in refs)
            if not blocking:
                _drop_finalizer(store, rt, o, FOREGROUND)
    for rt, o in objs:
        refs = meta(o).get("ownerReferences") or []
        if not refs or any(resources.by_kind(r.get("apiVersion", ""), r.get("kind", "")) is None for r in refs):
            continue
        absent = {r.get("uid") for r in refs if r.get("uid") not in uids}
        if not absent:
            continue
        if len(absent) == len({r.get("uid") for r in refs}):
            if not meta(o).get("deletionTimestamp"):
                _remove(store, rt, o, "Background")
        else:
            _drop_owners(store, rt, o, absent)


def garbage_collector(store: Store) -> ControlLoop:
    return ControlLoop(store, RESOURCES, lambda: collect(store), "gke-garbage-collector", _wants)
