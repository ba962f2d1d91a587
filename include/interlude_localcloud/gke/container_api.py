"""Google Kubernetes Engine API v1 (container.googleapis.com) subset over REST: clusters get/list,
node pools list/get/create/delete/setSize, operations get.

Resources are rendered in the shape of container.v1's discovery document (Cluster, NodePool,
Operation); strict mode validates every answer against it.
"""

from __future__ import annotations

from typing import Any

from interlude_localcloud.cloud import Cloud
from interlude_localcloud.errors import invalid
from interlude_localcloud.gke.clusters import ClusterState, Gke, PoolState
from interlude_localcloud.gke.config import EFFECTS
from interlude_localcloud.server import Request, Response, Router

DOC = "container.v1"
LOC = r"/v1/projects/(?P<project>[^/]+)/locations/(?P<location>[^/]+)"
CLUSTER = LOC + r"/clusters/(?P<cluster>[^/:]+)"
POOL = CLUSTER + r"/nodePools/(?P<pool>[^/:]+)"


def _base(c: ClusterState) -> str:
    return f"https://container.googleapis.com/v1/projects/{c.project}/locations/{c.spec.location}"


def render_pool(c: ClusterState, p: PoolState) -> dict[str, Any]:
    s = p.spec
    config: dict[str, Any] = {
        "machineType": s.machine_type,
        "diskSizeGb": 100,
        "diskType": "pd-balanced",
        "imageType": "COS_CONTAINERD",
        "labels": dict(s.labels),
        "spot": s.spot,
        "oauthScopes": ["https://www.googleapis.com/auth/cloud-platform"],
    }
    if s.metadata:
        config["metadata"] = dict(s.metadata)
    if s.taints:
        config["taints"] = [{"key": t.key, "value": t.value, "effect": EFFECTS[t.effect]} for t in s.taints]
    if s.gpu:
        config["accelerators"] = [{"acceleratorCount": str(s.gpu.count), "acceleratorType": s.gpu.type}]
    pool: dict[str, Any] = {
        "name": s.name,
        "config": config,
        "initialNodeCount": s.initial_nodes,
        "locations": list(s.zones),
        "autoscaling": {
            "enabled": True,
            "minNodeCount": s.min_nodes,
            "maxNodeCount": s.max_nodes,
            "locationPolicy": "ANY" if s.spot else "BALANCED",
        },
        "management": {"autoRepair": True, "autoUpgrade": True},
        "status": p.status,
        "version": c.spec.kubernetes_version,
        "podIpv4CidrSize": 24,
        "selfLink": f"{_base(c)}/clusters/{c.spec.name}/nodePools/{s.name}",
        "instanceGroupUrls": [
            f"https://www.googleapis.com/compute/v1/projects/{c.project}/zones/{z}/"
            f"instanceGroupManagers/gke-{c.spec.name}-{s.name}-grp"
            for z in s.zones
        ],
        "etag": f"{abs(hash((s.name, p.size, p.status))):x}",
    }
    if s.tpu:
        pool["placementPolicy"] = {"tpuTopology": s.tpu.topology}
    if p.status_message:
        pool["statusMessage"] = p.status_message
    return pool


def render_cluster(c: ClusterState) -> dict[str, Any]:
    pools = list(c.pools.values())
    zones = sorted({z for p in pools for z in p.spec.zones})
    return {
        "name": c.spec.name,
        "id": c.id,
        "location": c.spec.location,
        "zone": c.spec.location,
        "locations": zones,
        "endpoint": c.kube.endpoint,
        "status": "RUNNING",
        "masterAuth": {"clusterCaCertificate": c.kube.tls.ca_base64},
        "currentMasterVersion": c.spec.kubernetes_version,
        "currentNodeVersion": c.spec.kubernetes_version,
        "initialClusterVersion": c.spec.kubernetes_version,
        "createTime": c.created,
        "selfLink": f"{_base(c)}/clusters/{c.spec.name}",
        "network": "default",
        "subnetwork": "default",
        "currentNodeCount": sum(p.size for p in pools),
        "nodePools": [render_pool(c, p) for p in pools],
        "releaseChannel": {"channel": "REGULAR"},
        "clusterIpv4Cidr": "10.8.0.0/14",
        "servicesIpv4Cidr": "34.118.224.0/20",
    }


class ContainerApi:
    def __init__(self, cloud: Cloud, gke: Gke) -> None:
        self.cloud = cloud
        self.gke = gke

    def register(self, r: Router) -> None:
        r.add("GET", LOC + "/clusters", self.list_clusters, DOC)
        r.add("GET", CLUSTER, self.get_cluster, DOC)
        r.add("GET", CLUSTER + "/nodePools", self.list_pools, DOC)
        r.add("GET", POOL, self.get_pool, DOC)
        r.add("POST", CLUSTER + "/nodePools", self.create_pool, DOC, "CreateNodePoolRequest")
        r.add("DELETE", POOL, self.delete_pool, DOC)
        r.add("POST", POOL + ":setSize", self.set_size, DOC, "SetNodePoolSizeRequest")
        r.add("GET", LOC + r"/operations/(?P<op>[^/:]+)", self.get_operation, DOC)

    def _cluster(self, req: Request) -> ClusterState:
        p = req.params
        return self.gke.cluster(p["project"], p["location"], p["cluster"])

    def list_clusters(self, req: Request) -> Response:
        p = req.params
        with self.cloud.lock:
            out = [
                render_cluster(c)
                for (loc, _), c in sorted(self.gke.clusters.items())
                if c.project == p["project"] and p["location"] in ("-", loc)
            ]
        return Response({"clusters": out}, "ListClustersResponse")

    def get_cluster(self, req: Request) -> Response:
        with self.cloud.lock:
            return Response(render_cluster(self._cluster(req)), "Cluster")

    def list_pools(self, req: Request) -> Response:
        with self.cloud.lock:
            c = self._cluster(req)
            return Response({"nodePools": [render_pool(c, p) for p in c.pools.values()]}, "ListNodePoolsResponse")

    def get_pool(self, req: Request) -> Response:
        with self.cloud.lock:
            c = self._cluster(req)
            return Response(render_pool(c, self.gke.pool(c, req.params["pool"])), "NodePool")

    def create_pool(self, req: Request) -> Response:
        body = req.body or {}
        if not isinstance(body.get("nodePool"), dict):
            raise invalid("Invalid JSON payload received. nodePool is required.")
        with self.cloud.lock:
            return Response(self.gke.create_pool(self._cluster(req), body["nodePool"]), "Operation")

    def delete_pool(self, req: Request) -> Response:
        with self.cloud.lock:
            return Response(self.gke.delete_pool(self._cluster(req), req.params["pool"]), "Operation")

    def set_size(self, req: Request) -> Response:
        # proto3 JSON leaves a zero out: the real clients send `{}` to resize a pool to 0, and Google reads the
        # missing nodeCount as 0 (https://protobuf.dev/programming-guides/json/, default values omitted).
        body = req.body or {}
        with self.cloud.lock:
            return Response(
                self.gke.set_size(self._cluster(req), req.params["pool"], int(body.get("nodeCount", 0))), "Operation"
            )

    def get_operation(self, req: Request) -> Response:
        p = req.params
        with self.cloud.lock:
            return Response(self.gke.get_operation(p["project"], p["location"], p["op"]), "Operation")
