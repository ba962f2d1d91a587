"""The kubelet's bookkeeping of a pod's status: which container exits restart (restartPolicy), a terminated
container's state, and condition transition times."""

from __future__ import annotations

from typing import Any

from interlude_localcloud.gke.store import now


def restarts_after(spec: dict[str, Any], code: int) -> bool:
    """Whether an exited container is started again
    (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#restart-policy)."""
    policy = spec.get("restartPolicy", "Always")
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def terminated(code: int) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "finishedAt": now()}}


def transitions(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new` with the kubelet's bookkeeping: startTime set once, and each condition's lastTransitionTime kept
    while its status stays, set to now when it flips (what clients read as e.g. "Ready since";
    https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions)."""
    before = {c.get("type"): c for c in old.get("conditions") or ()}
    out = {**new, "startTime": old.get("startTime") or new["startTime"]}
    out["conditions"] = []
    for cond in new["conditions"]:
        prev = before.get(cond["type"])
        kept = prev.get("lastTransitionTime") if prev is not None and prev.get("status") == cond["status"] else None
        out["conditions"].append({**cond, "lastTransitionTime": kept or now()})
    return out
