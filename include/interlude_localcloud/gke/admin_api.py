"""Admin endpoints for GKE under `/_localcloud/gke/` (not Google's API): inject TPU/GPU stockouts per zone x
machine type, schedule node maintenance, preempt spot nodes, read the controllers' event log.

Times in bodies are scenario seconds from now (scaled by time_scale like everything else). A maintenance's
answer gives its window start on the scenario's clock (`window_start`, the clock of the event log) and as the
node's label will hold it (`window_start_epoch`: Unix epoch seconds of the wall clock, as on Google)."""

from __future__ import annotations

import time
from typing import Any

from interlude_localcloud.errors import ApiError, invalid, not_found
from interlude_localcloud.gke.clusters import ClusterState, Gke
from interlude_localcloud.gke.policy.maintenance import MaintenanceNotice
from interlude_localcloud.gke.runtime import ClusterRuntime
from interlude_localcloud.server import Request, Response, Router

C = r"/_localcloud/gke/clusters/(?P<cluster>[^/]+)"
N = C + r"/nodes/(?P<node>[^/:]+)"


class GkeAdminApi:
    def __init__(self, gke: Gke) -> None:
        self.gke = gke

    def register(self, r: Router) -> None:
        r.add("POST", r"/_localcloud/gke/stockouts", self.stockout)
        r.add("GET", C + r"/events", self.events)
        r.add("GET", C + r"/requests", self.requests)
        r.add("POST", N + r":maintenance", self.maintenance)
        r.add("POST", N + r":preempt", self.preempt)

    def _cluster(self, name: str) -> tuple[ClusterState, ClusterRuntime]:
        for c in self.gke.clusters.values():
            if c.spec.name == name and c.runtime is not None:
                return c, c.runtime
        raise not_found(f"cluster {name}")

    def _node(self, req: Request) -> tuple[ClusterRuntime, str]:
        c, rt = self._cluster(req.params["cluster"])
        if not any(n.name == req.params["node"] for n in rt.controllers.nodes()):
            raise not_found(f"node {req.params['node']}")
        return rt, req.params["node"]

    def stockout(self, req: Request) -> Response:
        """{zone, machine_type, stockout: true|false}: scale-ups of pools of that type in that zone fail."""
        b: dict[str, Any] = req.body or {}
        if not b.get("zone") or not b.get("machine_type"):
            raise invalid("zone and machine_type are required")
        key = (str(b["zone"]), str(b["machine_type"]))
        for c in self.gke.clusters.values():
            if c.runtime is None:
                continue
            with c.runtime.lock:
                stockouts = c.runtime.controllers.state.stockouts
                if b.get("stockout", True):
                    stockouts.add(key)
                else:
                    stockouts.discard(key)
                c.runtime.controllers.state.event(
                    c.runtime.now(),
                    "Stockout",
                    zone=key[0],
                    machine_type=key[1],
                    stockout=bool(b.get("stockout", True)),
                )
        return Response({"ok": True})

    def events(self, req: Request) -> Response:
        _, rt = self._cluster(req.params["cluster"])
        with rt.lock:
            return Response({"now": rt.now(), "events": list(rt.controllers.state.events)})

    def requests(self, req: Request) -> Response:
        """What the cluster's Kubernetes API server was asked at or after `since` (wall clock, epoch seconds):
        {t, method, path, query}, the clock of the events' ``at``."""
        c = next((c for c in self.gke.clusters.values() if c.spec.name == req.params["cluster"]), None)
        if c is None:  # with or without a runtime (pods as processes): the API server keeps the log
            raise not_found(f"cluster {req.params['cluster']}")
        since = float(req.query.get("since", "0") or 0)
        return Response({"requests": c.kube.requests.since(since)})

    def maintenance(self, req: Request) -> Response:
        """{notice_in, window_in, drain_seconds, duration_seconds, replaces_node}: a scheduled maintenance."""
        b: dict[str, Any] = req.body or {}
        rt, node = self._node(req)
        with rt.lock:
            now, wall = rt.now(), time.time()
            window_in = float(b.get("window_in", 600))
            try:
                notice = MaintenanceNotice(
                    notice_at=now + float(b.get("notice_in", 0)),
                    window_start=now + window_in,
                    window_epoch=wall + window_in / rt.time_scale,
                    drain_seconds=float(b.get("drain_seconds", 60)),
                    duration_seconds=float(b.get("duration_seconds", 600)),
                    replaces_node=bool(b.get("replaces_node", False)),
                )
            except ValueError as e:
                raise invalid(str(e)) from e
            rt.controllers.state.notices[node] = notice
            rt.controllers.state.event(now, "MaintenanceScheduled", node=node, window_start=notice.window_start)
        return Response({"ok": True, "window_start": notice.window_start, "window_start_epoch": notice.window_epoch})

    def preempt(self, req: Request) -> Response:
        rt, node = self._node(req)
        with rt.lock:
            view = next(n for n in rt.controllers.nodes() if n.name == node)
            if view.labels.get("cloud.google.com/gke-spot") != "true":
                raise ApiError(400, "only spot nodes can be preempted", "FAILED_PRECONDITION")
            rt.controllers.state.preempt_at[node] = rt.now()
        return Response({"ok": True})
