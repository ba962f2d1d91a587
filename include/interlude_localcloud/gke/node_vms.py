"""A GKE node is a Compute Engine instance: Compute's ``instances.simulateMaintenanceEvent`` on it reaches GKE.

On Google a node of a GKE pool is a Compute Engine VM named as the node (its ``providerID`` is
``gce://PROJECT/ZONE/NAME``), so the way to rehearse a host maintenance of a node is Compute Engine's
(https://cloud.google.com/compute/docs/instances/simulating-host-maintenance), and GKE then shows it on the
node as it shows a real one: the scheduled-maintenance labels at the notice, the impending-termination taint and
the pods' graceful termination at the window
(https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu). The local GKE keeps its
nodes in each cluster's Kubernetes store, apart from Compute's machines: this is the bridge the Compute API asks
when an instance it does not hold is named.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from interlude_localcloud.server import Request, Response

if TYPE_CHECKING:
    from interlude_localcloud.compute_base import ComputeBase
    from interlude_localcloud.gke.clusters import Gke
    from interlude_localcloud.gke.runtime import ClusterRuntime

ZONE_LABEL = "topology.kubernetes.io/zone"
#: From the taint to the host going down, in real seconds: the local kubelet's longest graceful termination
#: (kubelet.MAX_GRACE_SECONDS), so a pod that commits on SIGTERM is done before its host goes.
DRAIN_REAL_SECONDS = 10.0


class GkeNodeVms:
    """The nodes of every running cluster of one local cloud, as Compute Engine instances."""

    def __init__(self, gke: Gke) -> None:
        self.gke = gke

    def _runtime(self, project: str, zone: str, name: str) -> ClusterRuntime | None:
        from interlude_localcloud.gke.controllers import NODES  # here: a cloud without clusters never needs it

        for c in self.gke.clusters.values():
            if c.project != project or c.runtime is None:
                continue
            found, _ = c.kube.store.list(NODES, None, lambda o: o["metadata"]["name"] == name)
            if any((n["metadata"].get("labels") or {}).get(ZONE_LABEL) == zone for n in found):
                return c.runtime
        return None

    def exists(self, project: str, zone: str, name: str) -> bool:
        return self._runtime(project, zone, name) is not None

    def maintain(self, project: str, zone: str, name: str, notice_seconds: float, duration_seconds: float) -> bool:
        """Schedule the node's host maintenance ``notice_seconds`` (scenario) from now; False: no such node."""
        from interlude_localcloud.gke.policy.maintenance import MaintenanceNotice

        rt = self._runtime(project, zone, name)
        if rt is None:
            return False
        with rt.lock:
            now, wall = rt.now(), time.time()
            rt.controllers.state.notices[name] = MaintenanceNotice(
                notice_at=now,
                window_start=now + notice_seconds,
                window_epoch=wall + notice_seconds / rt.time_scale,
                drain_seconds=DRAIN_REAL_SECONDS * rt.time_scale,
                duration_seconds=duration_seconds,
            )
            rt.controllers.state.event(now, "MaintenanceScheduled", node=name, window_start=now + notice_seconds)
        return True


def gke_node_maintenance(api: ComputeBase, req: Request, extended: bool) -> Response | None:
    """Compute's simulateMaintenanceEvent on a GKE node's instance: its host maintenance as GKE shows it, the
    notice first with ``withExtendedNotifications`` (a GPU or TPU node cannot live-migrate), else at once.
    None when the name is no GKE node: the instance path answers (or says notFound). GKE's locks are taken
    outside the cloud's: the autoscaler takes them the other way round."""
    cloud = api.cloud
    zone, name, nodes = api.zone_of(req), req.params["name"], cloud.gke_nodes
    project = cloud.scenario.project
    with cloud.lock:
        if nodes is None or ("gce", zone, name) in cloud.machines:
            return None
    if not nodes.exists(project, zone, name):
        return None
    with cloud.lock:
        notice = cloud.choose_maintenance("gce")[1] if extended else 0.0
        duration = float(cloud.scenario.maintenance["gce"]["duration"])
        op = api.new_op(zone, "simulateMaintenanceEvent", None, name)
    nodes.maintain(project, zone, name, notice, duration)
    with cloud.lock:
        cloud.log("gke_node_maintenance", node=name, zone=zone, notice_seconds=notice)
        api.finish_op(op)
        return Response(dict(op), "Operation")
