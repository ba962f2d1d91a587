"""A Deployment controller without ReplicaSets: a Deployment's pods are created from its template and
replaced by a rolling update that honours maxSurge / maxUnavailable (or all at once for Recreate).

Follows the rules of https://kubernetes.io/docs/concepts/workloads/controllers/deployment/ :
new pods carry `pod-template-hash`, at most replicas + maxSurge pods exist during a rollout, at least
replicas - maxUnavailable stay ready (percentages round surge up and unavailability down; both zero
is treated as maxUnavailable 1), unready old pods go first. A pod is ready when its Ready condition
is True (set through `/status`, by whatever plays the kubelet). A Deployment being deleted is left alone
(its pods are the garbage collector's: `garbage_collector.py` deletes them, or orphans them for `Orphan`).
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from typing import Any

from interlude_localcloud.gke import defaults
from interlude_localcloud.gke.control_loop import ControlLoop
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store

DEPLOYMENTS = next(r for r in RESOURCES if r.plural == "deployments")
PODS = next(r for r in RESOURCES if r.plural == "pods")
HASH_LABEL = "pod-template-hash"
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def template_hash(template: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_ALPHABET[b % len(_ALPHABET)] for b in digest[:10])


def _scaled(value: Any, replicas: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        exact = replicas * int(value[:-1]) / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value or 0)


def surge_and_unavailable(spec: dict[str, Any]) -> tuple[int, int]:
    replicas = int(spec.get("replicas", 1))
    ru = (spec.get("strategy") or {}).get("rollingUpdate") or {}
    surge = _scaled(ru.get("maxSurge", "25%"), replicas, True)
    unavailable = _scaled(ru.get("maxUnavailable", "25%"), replicas, False)
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return surge, unavailable


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _owned_by(pod: dict[str, Any], uid: str) -> bool:
    return any(o.get("uid") == uid for o in pod["metadata"].get("ownerReferences") or [])


class DeploymentController(ControlLoop):
    """Reconciles every Deployment of one cluster whenever a Deployment or Pod changes."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, (DEPLOYMENTS, PODS), self.reconcile_all, "gke-deployment-controller")

    def reconcile_all(self) -> None:
        deployments, _ = self.store.list(DEPLOYMENTS, None)
        for d in deployments:
            if d["metadata"].get("deletionTimestamp"):  # as the real controller: no new pods for a dying owner
                continue
            try:
                self.reconcile_deployment(d)
            except KubeError:  # raced with a delete or an update: the next pass retries (the others go on)
                self._wake.set()

    def _delete(self, pod: dict[str, Any]) -> None:
        try:
            self.store.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except KubeError:
            pass

    def _create_pod(self, d: dict[str, Any], h: str) -> None:
        template = json.loads(json.dumps((d.get("spec") or {}).get("template") or {}))
        meta = template.get("metadata") or {}
        name = f"{d['metadata']['name']}-{h}-{''.join(secrets.choice(_ALPHABET) for _ in range(5))}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {**(meta.get("labels") or {}), HASH_LABEL: h},
                "annotations": dict(meta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": d["metadata"]["name"],
                        "uid": d["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template.get("spec") or {},
        }
        defaults.apply(PODS, pod)
        self.store.create(PODS, d["metadata"]["namespace"], pod)

    def reconcile_deployment(self, d: dict[str, Any]) -> None:
        spec = d.get("spec") or {}
        ns, uid = d["metadata"]["namespace"], d["metadata"]["uid"]
        replicas = int(spec.get("replicas", 1))
        h = template_hash(spec.get("template") or {})
        pods, _ = self.store.list(PODS, ns, lambda p: _owned_by(p, uid))
        new = [p for p in pods if p["metadata"].get("labels", {}).get(HASH_LABEL) == h]
        old = [p for p in pods if p not in new]
        if (spec.get("strategy") or {}).get("type") == "Recreate":
            for p in old:  # deletion is immediate here, so the new pods can follow at once
                self._delete(p)
            for _ in range(replicas - len(new)):
                self._create_pod(d, h)
            for p in sorted(new, key=is_ready)[: max(len(new) - replicas, 0)]:
                self._delete(p)
        else:
            self._roll(d, h, replicas, new, old)
        self._write_status(d, h)

    def _roll(
        self, d: dict[str, Any], h: str, replicas: int, new: list[dict[str, Any]], old: list[dict[str, Any]]
    ) -> None:
        surge, unavailable = surge_and_unavailable(d.get("spec") or {})
        # Scale the new pods up within the surge budget.
        room = min(replicas + surge - len(new) - len(old), replicas - len(new))
        for _ in range(max(room, 0)):
            self._create_pod(d, h)
        # Scale down: unready old pods first, then ready ones while enough pods stay ready.
        for p in [p for p in old if not is_ready(p)]:
            self._delete(p)
        old = [p for p in old if is_ready(p)]
        ready = sum(is_ready(p) for p in new) + len(old)
        budget = ready - (replicas - unavailable)
        for p in old[: max(budget, 0)]:
            self._delete(p)
        extra = len(new) - replicas
        for p in sorted(new, key=is_ready)[: max(extra, 0)]:
            self._delete(p)

    def _write_status(self, d: dict[str, Any], h: str) -> None:
        uid = d["metadata"]["uid"]
        pods, _ = self.store.list(PODS, d["metadata"]["namespace"], lambda p: _owned_by(p, uid))
        replicas = int((d.get("spec") or {}).get("replicas", 1))
        updated = [p for p in pods if p["metadata"].get("labels", {}).get(HASH_LABEL) == h]
        ready = sum(is_ready(p) for p in pods)
        available = ready >= replicas - surge_and_unavailable(d.get("spec") or {})[1]
        status: dict[str, Any] = {
            "observedGeneration": d["metadata"].get("generation", 1),
            "replicas": len(pods),
            "updatedReplicas": len(updated),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(len(pods) - ready, 0) if len(pods) >= replicas else replicas - ready,
            "conditions": [
                {
                    "type": "Available",
                    "status": "True" if available else "False",
                    "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                    "message": "Deployment has minimum availability."
                    if available
                    else "Deployment does not have minimum availability.",
                }
            ],
        }
        for k in ("readyReplicas", "availableReplicas", "unavailableReplicas", "updatedReplicas", "replicas"):
            if status[k] == 0:
                del status[k]
        if d.get("status") == status:
            return

        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            cur["status"] = status
            cur["metadata"].pop("resourceVersion", None)
            return cur

        self.store.update(DEPLOYMENTS, d["metadata"]["namespace"], d["metadata"]["name"], mutate, "status")
