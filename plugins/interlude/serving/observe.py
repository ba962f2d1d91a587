"""Kubernetes JSON (pods, nodes, events as the API returns them) -> the policy's typed observations.

Pure parsing, so triggers and operators hand the policy the same facts the tests do. Field meanings:
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-conditions (PodScheduled=False
with reason Unschedulable; Ready), https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/
(core/v1 Event and events.k8s.io/v1 field names), GKE node labels
https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus and .../how-to/gpus.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from interlude.serving.policy import CORDON_ANNOTATION, EventObs, NodeObs, PodObs

LABEL_TPU = "cloud.google.com/gke-tpu-accelerator"
LABEL_GPU = "cloud.google.com/gke-accelerator"


def epoch(stamp: str | None) -> float | None:
    """RFC 3339 (2026-12-02T16:50:56Z, with or without fractions) -> epoch seconds; None stays None."""
    if not stamp:
        return None
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def accelerator_of(labels: Mapping[str, str]) -> str | None:
    if LABEL_TPU in labels:
        return "tpu"
    if LABEL_GPU in labels:
        return "gpu"
    return None


def node_obs(node: Mapping[str, Any]) -> NodeObs:
    meta = node.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    return NodeObs(
        str(meta["name"]),
        accelerator_of(labels),
        _condition(node, "Ready").get("status") == "True",
        bool((node.get("spec") or {}).get("unschedulable")),
        labels,
        CORDON_ANNOTATION in (meta.get("annotations") or {}),
    )


def pod_obs(pod: Mapping[str, Any], node_accelerators: Mapping[str, str | None]) -> PodObs:
    """`node_accelerators` maps node name -> "tpu"/"gpu"/None (from node_obs); a deleting pod is Terminating."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    ready = _condition(pod, "Ready")
    scheduled = _condition(pod, "PodScheduled")
    unschedulable = scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
    node = spec.get("nodeName")
    return PodObs(
        name=str(meta["name"]),
        phase="Terminating" if meta.get("deletionTimestamp") else str(status.get("phase", "Pending")),
        ready=ready.get("status") == "True",
        node=node,
        accelerator=node_accelerators.get(node) if node else None,
        created_at=epoch(meta.get("creationTimestamp")) or 0.0,
        unschedulable_since=epoch(scheduled.get("lastTransitionTime")) if unschedulable else None,
        ready_at=epoch(ready.get("lastTransitionTime")) if ready.get("status") == "True" else None,
    )


def event_obs(event: Mapping[str, Any]) -> EventObs:
    """core/v1 Event (involvedObject, message, lastTimestamp) or events.k8s.io/v1 (regarding, note, eventTime)."""
    meta = event.get("metadata") or {}
    about = event.get("involvedObject") or event.get("regarding") or {}
    stamp = (
        event.get("lastTimestamp")
        or event.get("eventTime")
        or (event.get("series") or {}).get("lastObservedTime")
        or meta.get("creationTimestamp")
    )
    return EventObs(
        str(event.get("reason", "")),
        str(event.get("message") or event.get("note") or ""),
        str(about.get("name", "")),
        epoch(stamp) or 0.0,
    )
