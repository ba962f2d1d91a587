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


Dependents = dict[str, list[tuple[ResourceType, Obj]]]  # owner uid -> its dependents


def _finalize_orphan(store: Store, rt: ResourceType, owner: Obj, deps: Dependents) -> None:
    uid = meta(owner)["uid"]
    for drt, d in deps.get(uid, []):
        _drop_owners(store, drt, d, {uid})
    _drop_finalizer(store, rt, owner, ORPHAN)


def _finalize_foreground(store: Store, rt: ResourceType, owner: Obj, deps: Dependents) -> None:
    uid = meta(owner)["uid"]
    blocking = False
    for drt, d in deps.get(uid, []):
        gone = False  # a dependent already being deleted still blocks until it is gone
        if not meta(d).get("deletionTimestamp"):
            gone = _remove(store, drt, d, "Foreground" if deps.get(meta(d)["uid"]) else "Background")
        refs = [r for r in meta(d).get("ownerReferences") or [] if r.get("uid") == uid]
        blocking |= not gone and any(r.get("blockOwnerDeletion") for r in refs)
    if not blocking:
        _drop_finalizer(store, rt, owner, FOREGROUND)


def _collect_ownerless(store: Store, rt: ResourceType, obj: Obj, uids: set[str]) -> None:
    refs = meta(obj).get("ownerReferences") or []
    if not refs or any(resources.by_kind(r.get("apiVersion", ""), r.get("kind", "")) is None for r in refs):
        return
    absent = {r.get("uid") for r in refs if r.get("uid") not in uids}
    if not absent:
        return
    if len(absent) < len({r.get("uid") for r in refs}):
        _drop_owners(store, rt, obj, {str(u) for u in absent})
    elif not meta(obj).get("deletionTimestamp"):
        _remove(store, rt, obj, "Background")


def collect(store: Store) -> None:
    """One pass of the collector over every object of the cluster."""
    objs = list(store.objects())
    uids = {meta(o)["uid"] for _, o in objs}
    deps: Dependents = {}
    for rt, o in objs:
        for ref in meta(o).get("ownerReferences") or []:
            deps.setdefault(ref.get("uid"), []).append((rt, o))
    for rt, o in objs:
        finalizers = meta(o).get("finalizers") or []
        if meta(o).get("deletionTimestamp") and ORPHAN in finalizers:
            _finalize_orphan(store, rt, o, deps)
        elif meta(o).get("deletionTimestamp") and FOREGROUND in finalizers:
            _finalize_foreground(store, rt, o, deps)
    for rt, o in objs:
        _collect_ownerless(store, rt, o, uids)


def garbage_collector(store: Store) -> ControlLoop:
    return ControlLoop(store, RESOURCES, lambda: collect(store), "gke-garbage-collector", _wants)
