"""The `pods/{name}/eviction` subresource (policy/v1 Eviction) and the PodDisruptionBudgets it honours.

As the API server does (https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/ and
https://kubernetes.io/docs/tasks/run-application/configure-pdb/): an eviction of a pod that no budget selects
deletes it; with one budget it is allowed only while the budget has a disruption to spare
(`currentHealthy - desiredHealthy >= 1`), else **429 TooManyRequests** with the cause `DisruptionBudget`; a
pod selected by more than one budget is refused with 500. A pod that is not Running (Pending, Succeeded,
Failed) is evicted without looking at budgets; an unhealthy (not Ready) Running pod only while the budget
is met (`unhealthyPodEvictionPolicy: IfHealthyBudget`, the default) or always (`AlwaysAllow`).

Difference from Kubernetes: no disruption controller runs in the background; each eviction computes the
budget from the pods now and writes the budget's status then (deletes are immediate here, so no
`disruptedPods` bookkeeping is needed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from interlude_localcloud.gke import resources
from interlude_localcloud.gke.status import KubeError, bad_request
from interlude_localcloud.gke.store import Store

Obj = dict[str, Any]
PODS = resources.find("", "v1", "pods")
PDBS = resources.find("policy", "v1", "poddisruptionbudgets")
DEPLOYMENTS = resources.find("apps", "v1", "deployments")


def _expression(expr: Obj) -> Callable[[dict[str, str]], bool]:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), set(expr.get("values") or ())
    tests: dict[str, Callable[[dict[str, str]], bool]] = {
        "In": lambda labels: labels.get(key) in values,
        "NotIn": lambda labels: labels.get(key) not in values,
        "Exists": lambda labels: key in labels,
        "DoesNotExist": lambda labels: key not in labels,
    }
    if op not in tests:
        raise bad_request(f"{op!r} is not a valid label selector operator")
    return tests[op]


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector: matchLabels AND matchExpressions; an empty selector selects every pod
    (policy/v1), a missing one none."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(_expression(e)(labels) for e in selector.get("matchExpressions") or ())


def _ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _scaled(value: Any, expected: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * expected / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def _expected(store: Store, namespace: str, pods: list[Obj]) -> int:
    """The owning controllers' desired replicas (pods without a Deployment owner count once each)."""
    owners: set[str] = set()
    bare = 0
    for pod in pods:
        refs = [o for o in pod["metadata"].get("ownerReferences") or [] if o.get("kind") == "Deployment"]
        if refs:
            owners.add(refs[0]["name"])
        else:
            bare += 1
    total = bare
    for name in owners:
        if store.exists(DEPLOYMENTS, namespace, name):
            total += int((store.get(DEPLOYMENTS, namespace, name).get("spec") or {}).get("replicas", 1))
    return total


def budget_status(store: Store, pdb: Obj) -> Obj:
    """currentHealthy, desiredHealthy, expectedPods, disruptionsAllowed of one budget, from the pods now."""
    namespace = pdb["metadata"]["namespace"]
    spec = pdb.get("spec") or {}
    pods, _ = store.list(PODS, namespace, lambda p: selects(spec.get("selector"), p["metadata"].get("labels") or {}))
    pods = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")]
    healthy = sum(1 for p in pods if _ready(p))
    if spec.get("maxUnavailable") is not None:
        expected = _expected(store, namespace, pods)
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:
        expected = len(pods) if not isinstance(spec.get("minAvailable"), str) else _expected(store, namespace, pods)
        desired = _scaled(spec.get("minAvailable", 1), expected, round_up=True)
    return {
        "observedGeneration": int(pdb["metadata"].get("generation", 1)),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": max(0, healthy - desired),
    }


def _record(store: Store, pdb: Obj, status: Obj) -> None:
    def mutate(cur: Obj) -> Obj:
        cur["status"] = {**(cur.get("status") or {}), **status}
        return cur

    store.update(PDBS, pdb["metadata"]["namespace"], pdb["metadata"]["name"], mutate, "status")


def _too_many(pdb: Obj, status: Obj) -> KubeError:
    name = pdb["metadata"]["name"]
    cause = (
        f"The disruption budget {name} needs {status['desiredHealthy']} healthy pods and has "
        f"{status['currentHealthy']} currently"
    )
    return KubeError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )


def _allowed(store: Store, pod: Obj, pdb: Obj) -> None:
    """Raise 429 unless the budget lets this pod go now; record the budget's status either way."""
    status = budget_status(store, pdb)
    if not _ready(pod):
        policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
        if policy == "AlwaysAllow" or status["currentHealthy"] >= status["desiredHealthy"]:
            _record(store, pdb, status)
            return
        _record(store, pdb, status)
        raise _too_many(pdb, status)
    if status["disruptionsAllowed"] < 1:
        _record(store, pdb, status)
        raise _too_many(pdb, status)
    _record(store, pdb, {**status, "disruptionsAllowed": status["disruptionsAllowed"] - 1})


def evict(store: Store, namespace: str, name: str, body: Any) -> Obj:
    """POST pods/{name}/eviction: delete the pod if its budget allows; the Status the API server answers."""
    if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
        raise bad_request("the object provided is unrecognized or malformed: expected a policy/v1 Eviction")
    if (body.get("metadata") or {}).get("name") not in (None, name):
        raise bad_request("name in URL does not match name in Eviction object")
    with store.lock:
        pod = store.get(PODS, namespace, name)
        if _phase(pod) == "Running":
            labels = pod["metadata"].get("labels") or {}
            budgets, _ = store.list(PDBS, namespace, lambda b: selects((b.get("spec") or {}).get("selector"), labels))
            if len(budgets) > 1:
                raise KubeError(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                )
            if budgets:
                _allowed(store, pod, budgets[0])
        store.delete(PODS, namespace, name)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
