"""The Kubernetes resource types this API server serves, as discovery lists them.

Names, kinds, verbs and short names as `kubectl api-resources` shows them on a GKE cluster; the
ComputeClass CRD is cluster-scoped, group cloud.google.com, plural computeclasses
(https://cloud.google.com/kubernetes-engine/docs/reference/crds/computeclass); Managed Service for
Prometheus' PodMonitoring is namespaced, group monitoring.googleapis.com, plural podmonitorings
(https://cloud.google.com/stackdriver/docs/managed-prometheus/setup-managed); RBAC kinds as in
https://kubernetes.io/docs/reference/access-authn-authz/rbac/; PodDisruptionBudget (policy/v1) and the
pods/eviction subresource as in https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/;
Endpoints (v1) and EndpointSlices (discovery.k8s.io/v1) as in
https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/; Job (batch/v1) and the JobSet CRD
(jobset.x-k8s.io/v1alpha2, plural jobsets, as its CRD in github.com/kubernetes-sigs/jobset declares it).
"""

from __future__ import annotations

from dataclasses import dataclass

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    generation: bool = False  # metadata.generation tracks spec changes

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def qualified(self) -> str:
        """How error messages name the resource: `deployments.apps`, `pods`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def group_kind(self) -> str:
        """`Deployment.apps` as the API server's Invalid messages say it."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "namespaces", "Namespace", False, ("ns",), ("status",)),
    ResourceType("", "v1", "pods", "Pod", True, ("po",), ("status", "log", "binding", "eviction")),
    ResourceType("", "v1", "services", "Service", True, ("svc",), ("status",)),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, ("cm",)),
    ResourceType("", "v1", "nodes", "Node", False, ("no",), ("status",)),
    ResourceType("", "v1", "events", "Event", True, ("ev",)),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, ("sa",)),
    ResourceType("", "v1", "endpoints", "Endpoints", True, ("ep",)),
    ResourceType("apps", "v1", "deployments", "Deployment", True, ("deploy",), ("status", "scale"), True),
    ResourceType("batch", "v1", "jobs", "Job", True, (), ("status",), True),
    ResourceType(
        "autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), ("status",), True
    ),
    ResourceType("cloud.google.com", "v1", "computeclasses", "ComputeClass", False, ("cc",), ("status",), True),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",), True),
    ResourceType("monitoring.googleapis.com", "v1", "podmonitorings", "PodMonitoring", True, (), ("status",), True),
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", True),
    ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True, (), ("status",), True),
)

GROUPS: dict[str, list[str]] = {}
for _rt in RESOURCES:
    if _rt.group:
        GROUPS.setdefault(_rt.group, [])
        if _rt.version not in GROUPS[_rt.group]:
            GROUPS[_rt.group].append(_rt.version)


def find(group: str, version: str, plural: str) -> ResourceType | None:
    return next((r for r in RESOURCES if (r.group, r.version, r.plural) == (group, version, plural)), None)


def by_kind(api_version: str, kind: str) -> ResourceType | None:
    return next((r for r in RESOURCES if (r.api_version, r.kind) == (api_version, kind)), None)


def api_resource_list(group: str, version: str) -> dict[str, object]:
    """`/api/v1` or `/apis/{group}/{version}`: the APIResourceList clients discover kinds from."""
    out: list[dict[str, object]] = []
    for r in RESOURCES:
        if (r.group, r.version) != (group, version):
            continue
        out.append(
            {
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": VERBS,
                "shortNames": list(r.short_names),
            }
        )
        for sub in r.subresources:
            verbs = {"log": ["get"], "binding": ["create"], "eviction": ["create"]}.get(sub, ["get", "patch", "update"])
            entry: dict[str, object] = {
                "name": f"{r.plural}/{sub}",
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": {"scale": "Scale", "eviction": "Eviction", "binding": "Binding"}.get(sub, r.kind),
                "verbs": verbs,
            }
            if sub in ("scale", "eviction"):
                entry["group"], entry["version"] = ("autoscaling", "v1") if sub == "scale" else ("policy", "v1")
            out.append(entry)
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": out}


def api_group_list() -> dict[str, object]:
    groups = []
    for g, versions in GROUPS.items():
        vs = [{"groupVersion": f"{g}/{v}", "version": v} for v in versions]
        groups.append({"name": g, "versions": vs, "preferredVersion": vs[0]})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
