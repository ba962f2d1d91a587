"""From Kubernetes objects (dicts as the API server stores them) to the policies' typed views.

A reconcile loop reads pods from the store and hands :class:`PodView` values to the scheduler and the
autoscaler; this is the one place that knows the manifest shape. Quantities follow Kubernetes' format
(https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/): ``500m``, ``43Gi``,
``1e3``. A container's requests default to its limits, as the API server does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from interlude_localcloud.gke.policy.model import NodeSelectorRequirement, NodeSelectorTerm, PodView, Toleration

HOSTNAME = "kubernetes.io/hostname"

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_SUFFIX = {
    None: 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def parse_quantity(value: str | int | float) -> float:
    """``"43Gi"`` -> 46170898432.0, ``"500m"`` -> 0.5; a malformed quantity raises ValueError."""
    if isinstance(value, int | float):
        return float(value)
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def _container_requests(container: Mapping[str, Any]) -> dict[str, float]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: parse_quantity(amount) for name, amount in merged.items()}


def pod_requests(spec: Mapping[str, Any]) -> dict[str, float]:
    """Sum over containers, at least the largest init container (how the scheduler counts a pod)."""
    total: dict[str, float] = {}
    for container in spec.get("containers") or ():
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, 0.0) + amount
    for container in spec.get("initContainers") or ():
        for name, amount in _container_requests(container).items():
            total[name] = max(total.get(name, 0.0), amount)
    return total


def _toleration(raw: Mapping[str, Any]) -> Toleration:
    operator = raw.get("operator", "Equal")
    if operator not in ("Equal", "Exists"):
        raise ValueError(f"toleration operator must be Equal or Exists, got {operator!r}")
    return Toleration(str(raw.get("key", "")), operator, str(raw.get("value", "")), str(raw.get("effect", "")))


def _term(raw: Mapping[str, Any]) -> NodeSelectorTerm:
    requirements = []
    for expr in raw.get("matchExpressions") or ():
        if expr.get("operator") not in _OPERATORS:
            raise ValueError(f"node selector operator {expr.get('operator')!r} is not one of {_OPERATORS}")
        requirements.append(
            NodeSelectorRequirement(str(expr["key"]), expr["operator"], tuple(str(v) for v in expr.get("values") or ()))
        )
    return NodeSelectorTerm(tuple(requirements))


def _anti_affinity(spec: Mapping[str, Any]) -> tuple[dict[str, str], ...]:
    """Required podAntiAffinity terms over nodes (topologyKey kubernetes.io/hostname) as their matchLabels;
    other topologies and matchExpressions are not modelled (ignored)."""
    terms = ((spec.get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or ()
    return tuple(
        {str(k): str(v) for k, v in ((t.get("labelSelector") or {}).get("matchLabels") or {}).items()}
        for t in terms
        if t.get("topologyKey") == HOSTNAME and (t.get("labelSelector") or {}).get("matchLabels")
    )


def pod_from_manifest(pod: Mapping[str, Any], created_at: float = 0.0) -> PodView:
    """A ``v1/Pod`` as stored (metadata + spec) -> the view the scheduler and autoscaler use."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    owners = metadata.get("ownerReferences") or ()
    return PodView(
        name=str(metadata.get("name", "")),
        node_selector={str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()},
        tolerations=tuple(_toleration(t) for t in spec.get("tolerations") or ()),
        requests=pod_requests(spec),
        required_affinity=tuple(_term(t) for t in required.get("nodeSelectorTerms") or ()),
        node_name=spec.get("nodeName") or None,
        owner=str(owners[0].get("name", "")) if owners else "",
        created_at=created_at,
        labels={str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
        anti_affinity=_anti_affinity(spec),
    )
