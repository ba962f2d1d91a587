"""Endpoints (v1) and EndpointSlices (discovery.k8s.io/v1) kept from Services' selectors and pods' readiness.

What kube-controller-manager's endpoints and endpointslice controllers do
(https://kubernetes.io/docs/concepts/services-networking/endpoint-slices/,
https://kubernetes.io/docs/concepts/services-networking/service/#endpoints): for every Service with a
selector, the pods it selects that have an IP make its Endpoints (same name; Ready pods in `addresses`,
others in `notReadyAddresses`) and its EndpointSlices (`kubernetes.io/service-name`, owned by the Service,
one per set of resolved ports; `conditions.ready/serving/terminating`). A pod being deleted leaves
Endpoints but stays in the slices as terminating. `publishNotReadyAddresses` counts every pod as ready.
Headless Services (`clusterIP: None`) get both too, labelled `service.kubernetes.io/headless`; a pod whose
`spec.subdomain` names the Service carries its `spec.hostname` (the DNS record a JobSet's pods use).
Services without a selector are their owners' to fill.
"""

from __future__ import annotations

import json
from typing import Any

from interlude_localcloud.gke.control_loop import ControlLoop, meta
from interlude_localcloud.gke.deployments import is_ready
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store, WatchEvent

Obj = dict[str, Any]
_BY_PLURAL = {r.plural: r for r in RESOURCES}
SERVICES, PODS, NODES = _BY_PLURAL["services"], _BY_PLURAL["pods"], _BY_PLURAL["nodes"]
ENDPOINTS, SLICES = _BY_PLURAL["endpoints"], _BY_PLURAL["endpointslices"]
SERVICE_NAME = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
HEADLESS = "service.kubernetes.io/headless"


def _in_endpoints(pod: Obj, terminating_too: bool) -> bool:
    """kube-controller-manager's ShouldPodBeInEndpoints: an IP, not finished for good, (not terminating)."""
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    if not status.get("podIP") or (meta(pod).get("deletionTimestamp") and not terminating_too):
        return False
    done = {"Never": ("Succeeded", "Failed"), "OnFailure": ("Succeeded",)}.get(spec.get("restartPolicy", ""), ())
    return status.get("phase") not in done


def _ports(svc: Obj, pod: Obj) -> list[Obj] | None:
    """The Service's ports resolved against the pod (named targetPorts by container port name)."""
    out = []
    named = {
        p.get("name"): p.get("containerPort")
        for c in (pod.get("spec") or {}).get("containers") or []
        for p in c.get("ports") or []
    }
    for sp in (svc.get("spec") or {}).get("ports") or []:
        target = sp.get("targetPort", sp.get("port"))
        port = int(target) if isinstance(target, int) or str(target).isdigit() else named.get(target)
        if port is None:
            continue
        entry: Obj = {"port": int(port), "protocol": sp.get("protocol", "TCP")}
        if sp.get("name"):
            entry["name"] = sp["name"]
        out.append(entry)
    if not out and (svc.get("spec") or {}).get("ports") and (svc.get("spec") or {}).get("clusterIP") != "None":
        return None  # none of the Service's ports exists on this pod
    return out


def _target(pod: Obj) -> Obj:
    m = meta(pod)
    return {"kind": "Pod", "namespace": m["namespace"], "name": m["name"], "uid": m["uid"]}


def _hostname(svc: Obj, pod: Obj) -> str | None:
    spec = pod.get("spec") or {}
    return spec.get("hostname") if spec.get("hostname") and spec.get("subdomain") == meta(svc)["name"] else None


def _labels(svc: Obj) -> dict[str, str]:
    labels = dict(meta(svc).get("labels") or {})
    if (svc.get("spec") or {}).get("clusterIP") == "None":
        labels[HEADLESS] = ""
    return labels


def desired_endpoints(svc: Obj, pods: list[Obj]) -> Obj:
    publish_all = bool((svc.get("spec") or {}).get("publishNotReadyAddresses"))
    subsets: dict[str, Obj] = {}
    for pod in pods:
        ports = _ports(svc, pod)
        if ports is None or not _in_endpoints(pod, False):
            continue
        address: Obj = {"ip": pod["status"]["podIP"], "targetRef": _target(pod)}
        if pod["spec"].get("nodeName"):
            address["nodeName"] = pod["spec"]["nodeName"]
        if host := _hostname(svc, pod):
            address["hostname"] = host
        subset = subsets.setdefault(json.dumps(ports, sort_keys=True), {"ports": ports} if ports else {})
        key = "addresses" if publish_all or is_ready(pod) else "notReadyAddresses"
        subset.setdefault(key, []).append(address)
    for subset in subsets.values():
        for key in ("addresses", "notReadyAddresses"):
            subset.get(key, []).sort(key=lambda a: (a["ip"], a["targetRef"]["name"]))
    m = meta(svc)
    out: Obj = {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": m["name"], "namespace": m["namespace"]}}
    if labels := _labels(svc):
        out["metadata"]["labels"] = labels
    if subsets:
        out["subsets"] = [subsets[k] for k in sorted(subsets)]
    return out


def desired_slices(svc: Obj, pods: list[Obj], zones: dict[str, str]) -> dict[str, Obj]:
    """Slice bodies keyed by their ports (JSON); one empty placeholder when no pod serves."""
    publish_all = bool((svc.get("spec") or {}).get("publishNotReadyAddresses"))
    groups: dict[str, list[Obj]] = {}
    for pod in pods:
        ports = _ports(svc, pod)
        if ports is None or not _in_endpoints(pod, True):
            continue
        terminating = bool(meta(pod).get("deletionTimestamp"))
        serving = publish_all or is_ready(pod)
        endpoint: Obj = {
            "addresses": [pod["status"]["podIP"]],
            "conditions": {"ready": serving and not terminating, "serving": serving, "terminating": terminating},
            "targetRef": _target(pod),
        }
        node = pod["spec"].get("nodeName")
        if node:
            endpoint["nodeName"] = node
            if zones.get(node):
                endpoint["zone"] = zones[node]
        if host := _hostname(svc, pod):
            endpoint["hostname"] = host
        groups.setdefault(json.dumps(ports, sort_keys=True), []).append(endpoint)
    if not groups:
        groups["[]"] = []
    m = meta(svc)
    labels = {**_labels(svc), SERVICE_NAME: m["name"], MANAGED_BY: SLICE_CONTROLLER}
    owner = {"apiVersion": "v1", "kind": "Service", "name": m["name"], "uid": m["uid"]}
    owner.update(controller=True, blockOwnerDeletion=True)
    return {
        key: {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"generateName": f"{m['name']}-", "labels": labels, "ownerReferences": [owner]},
            "addressType": "IPv4",
            "endpoints": sorted(eps, key=lambda e: (e["addresses"][0], e["targetRef"]["name"])),
            "ports": json.loads(key),
        }
        for key, eps in groups.items()
    }


def _selects(selector: dict[str, str], pod: Obj) -> bool:
    labels = meta(pod).get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _wants(ev: WatchEvent) -> bool:
    """Services always; pods only when something an endpoint shows changed (not every status write)."""
    if ev.rt is not PODS or ev.prev is None or ev.type != "MODIFIED":
        return True

    def shown(p: Obj) -> Any:
        st = p.get("status") or {}
        return (
            meta(p).get("labels"),
            meta(p).get("deletionTimestamp"),
            st.get("podIP"),
            st.get("phase"),
            is_ready(p),
            (p.get("spec") or {}).get("nodeName"),
        )

    return shown(ev.object) != shown(ev.prev)


class EndpointsController:
    def __init__(self, store: Store) -> None:
        self.store = store

    def _write(self, rt: Any, ns: str, body: Obj, name: str | None) -> None:
        """Create, or replace the controller's fields of an existing object (no write when equal)."""
        if name is None:
            self.store.create(rt, ns, body)
            return

        def mutate(cur: Obj) -> Obj:
            new = {**cur, **{k: v for k, v in body.items() if k != "metadata"}}
            if "subsets" not in body:
                new.pop("subsets", None)
            new["metadata"] = {**cur["metadata"], "labels": body["metadata"].get("labels")}
            if new["metadata"]["labels"] is None:
                new["metadata"].pop("labels")
            new["metadata"].pop("resourceVersion", None)
            return new

        self.store.update(rt, ns, name, mutate)

    def reconcile(self) -> None:
        services = self.store.list(SERVICES, None)[0]
        pods = self.store.list(PODS, None)[0]
        zones = {
            meta(n)["name"]: (meta(n).get("labels") or {}).get("topology.kubernetes.io/zone", "")
            for n in self.store.list(NODES, None)[0]
        }
        managed = {(meta(s)["namespace"], meta(s)["name"]) for s in services if (s.get("spec") or {}).get("selector")}
        for svc in services:
            ns, name = meta(svc)["namespace"], meta(svc)["name"]
            if (ns, name) not in managed or (svc.get("spec") or {}).get("type") == "ExternalName":
                continue
            selected = [p for p in pods if meta(p)["namespace"] == ns and _selects(svc["spec"]["selector"], p)]
            self._write(
                ENDPOINTS,
                ns,
                desired_endpoints(svc, selected),
                name if self.store.exists(ENDPOINTS, ns, name) else None,
            )
            self._sync_slices(svc, desired_slices(svc, selected, zones))
        for ep in self.store.list(ENDPOINTS, None)[0]:  # a Service gone: its Endpoints go (they have no owner)
            key = (meta(ep)["namespace"], meta(ep)["name"])
            if key not in managed and not self.store.exists(SERVICES, *key):
                self._delete(ENDPOINTS, ep)

    def _sync_slices(self, svc: Obj, want: dict[str, Obj]) -> None:
        ns, name = meta(svc)["namespace"], meta(svc)["name"]
        mine = self.store.list(
            SLICES,
            ns,
            lambda s: (
                (meta(s).get("labels") or {}).get(SERVICE_NAME) == name
                and (meta(s).get("labels") or {}).get(MANAGED_BY) == SLICE_CONTROLLER
            ),
        )[0]
        for cur in mine:
            key = json.dumps(cur.get("ports") or [], sort_keys=True)
            body = want.pop(key, None)
            if body is None:
                self._delete(SLICES, cur)
            else:
                self._write(SLICES, ns, body, meta(cur)["name"])
        for body in want.values():
            self.store.create(SLICES, ns, body)

    def _delete(self, rt: Any, obj: Obj) -> None:
        try:
            self.store.delete(rt, meta(obj)["namespace"], meta(obj)["name"])
        except KubeError:
            pass


def endpoints_controller(store: Store) -> ControlLoop:
    controller = EndpointsController(store)
    return ControlLoop(store, (SERVICES, PODS, NODES), controller.reconcile, "gke-endpoints-controller", _wants)
