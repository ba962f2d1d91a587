"""In-process local cloud for tests: `with running_localcloud("default") as lc: ...`."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from interlude_localcloud import scenario as scenario_mod
from interlude_localcloud.app import LocalCloud
from interlude_localcloud.scenario import Scenario


class Admin:
    """Client for the `/_localcloud/` admin endpoints (works against a subprocess cloud too)."""

    def __init__(self, api_endpoint: str) -> None:
        self.base = api_endpoint.rstrip("/") + "/_localcloud"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"{}")

    def events(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The event log: every create/delete/boot/maintenance/preemption/fault with timestamps."""
        return self._call("GET", f"/events?since={since}")["events"]

    def requests(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The request log: every Google API request the cloud received ({t, method, path}; admin calls not)."""
        return self._call("GET", f"/requests?since={since}")["requests"]

    def violations(self) -> list[str]:
        """Strict-mode schema violations and internal errors seen so far."""
        return self._call("GET", "/violations")["violations"]

    def machines(self) -> list[dict[str, Any]]:
        return self._call("GET", "/machines")["machines"]

    def lifetimes(self, since: float = 0.0) -> list[dict[str, Any]]:
        """Every machine alive at or after `since` (epoch seconds): {id, kind, zone, name, created, deleted}."""
        return self._call("GET", f"/lifetimes?since={since}")["lifetimes"]

    def machine(self, kind: str, zone: str, name: str) -> dict[str, Any] | None:
        return next((m for m in self.machines() if m["id"] == f"{kind}-{zone}-{name}"), None)

    def inject_fault(self, path_regex: str, status: int = 503, count: int = 1, method: str | None = None) -> None:
        """The next `count` API requests whose path matches answer with `status` (429/503 bursts)."""
        self._call("POST", "/faults", {"path_regex": path_regex, "status": status, "count": count, "method": method})

    def next_maintenance(
        self,
        type: str = "SCHEDULED",
        notice_seconds: float | None = None,
        kind: str | None = None,
        held: bool = False,
        latest_start_after: float | None = None,
    ) -> None:
        """Type/notice (simulated seconds) of the next simulateMaintenanceEvent (kind tpu|gce|None=any); `held`:
        its window waits for :meth:`open_window` (see :meth:`maintenance`)."""
        body: dict[str, Any] = {"type": type, "notice_seconds": notice_seconds, "kind": kind}
        self._call("POST", "/next-maintenance", _window(body, held, latest_start_after))

    def set_capacity(self, zone: str, kind: str, accelerator_type: str, on_demand: int = 0, spot: int = 0) -> None:
        """Change what a zone can still create of a type (0/0: every further create is a stockout)."""
        self._call(
            "POST",
            "/capacity",
            {"zone": zone, "kind": kind, "type": accelerator_type, "on_demand": on_demand, "spot": spot},
        )

    def preempt(self, kind: str, zone: str, name: str, worker: int | None = None) -> None:
        """Spot preemption (of one worker of a multi-host slice: the whole slice goes)."""
        self._call("POST", f"/machines/{kind}/{zone}/{name}:preempt", _worker({}, worker))

    def crash(self, kind: str, zone: str, name: str, worker: int | None = None) -> None:
        """SIGKILL the guest (one worker of a slice), which reboots."""
        self._call("POST", f"/machines/{kind}/{zone}/{name}:crash", _worker({}, worker))

    def maintenance(
        self,
        kind: str,
        zone: str,
        name: str,
        type: str = "UNSCHEDULED",
        notice_seconds: float | None = None,
        worker: int | None = None,
        held: bool = False,
        latest_start_after: float | None = None,
    ) -> None:
        """Google-initiated maintenance on a machine (one worker's host of a slice; default: unscheduled,
        short notice).

        The window opens at windowStartTime on the scenario's clock, unless `held`: then the test owns that moment.
        The notice reads as any other (PENDING, windowStartTime = now + notice, latestWindowStartTime
        `latest_start_after` simulated seconds later (default: the scenario's `maintenance.<kind>.latest_start_after`),
        windowEndTime after that), and the window opens when the test calls :meth:`open_window` (not before
        windowStartTime), on ``performMaintenance``, or at latestWindowStartTime at the latest."""
        body = _worker({"type": type, "notice_seconds": notice_seconds}, worker)
        self._call("POST", f"/machines/{kind}/{zone}/{name}:maintenance", _window(body, held, latest_start_after))

    def open_window(self, kind: str, zone: str, name: str, worker: int | None = None) -> dict[str, float]:
        """Open a held maintenance window: now, or at its windowStartTime if that is still ahead (the control plane
        was told it would not open before). Returns {opens_at, window_start, latest_start}, epoch seconds."""
        return dict(self._call("POST", f"/machines/{kind}/{zone}/{name}:open-window", _worker({}, worker)))

    def gke_stockout(self, zone: str, machine_type: str, stockout: bool = True) -> None:
        """GKE scale-ups of `machine_type` pools in `zone` fail (ZONE_RESOURCE_POOL_EXHAUSTED) until cleared."""
        self._call("POST", "/gke/stockouts", {"zone": zone, "machine_type": machine_type, "stockout": stockout})

    def gke_node_maintenance(
        self, cluster: str, node: str, notice_in: float = 0.0, window_in: float = 600.0, **more: Any
    ) -> float:
        """Scheduled maintenance of a GKE node (scenario seconds from now); returns the window start."""
        return float(self.gke_node_maintenance_window(cluster, node, notice_in, window_in, **more)["window_start"])

    def gke_node_maintenance_window(
        self, cluster: str, node: str, notice_in: float = 0.0, window_in: float = 600.0, **more: Any
    ) -> dict[str, float]:
        """The same, answering both clocks: `window_start` (scenario time, the event log's) and
        `window_start_epoch` (wall-clock epoch seconds: what the node's scheduled-maintenance-time label holds)."""
        body = {"notice_in": notice_in, "window_in": window_in, **more}
        return dict(self._call("POST", f"/gke/clusters/{cluster}/nodes/{node}:maintenance", body))

    def gke_preempt(self, cluster: str, node: str) -> None:
        self._call("POST", f"/gke/clusters/{cluster}/nodes/{node}:preempt", {})

    def gke_events(self, cluster: str) -> dict[str, Any]:
        """{now, events}: the cluster's scheduler/autoscaler/maintenance decisions (scenario time `t`, wall `at`)."""
        return self._call("GET", f"/gke/clusters/{cluster}/events")

    def gke_requests(self, cluster: str, since: float = 0.0) -> list[dict[str, Any]]:
        """Every request the cluster's Kubernetes API server got at or after `since` (wall clock):
        {t, method, path, query}, oldest first."""
        return self._call("GET", f"/gke/clusters/{cluster}/requests?since={since}")["requests"]


def _worker(body: dict[str, Any], worker: int | None) -> dict[str, Any]:
    return body if worker is None else {**body, "worker": worker}


def _window(body: dict[str, Any], held: bool, latest_start_after: float | None) -> dict[str, Any]:
    """A maintenance body with a held window's fields (none for a window on the scenario's clock)."""
    if held:
        body = {**body, "held": True}
    return body if latest_start_after is None else {**body, "latest_start_after": latest_start_after}


def most_alive_at_once(lifetimes: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """The peak of machines alive at once over `lifetimes` (Admin.lifetimes), and which ones, by a sweep over
    their created/deleted times. A machine deleted at the instant another is created does not overlap it;
    one still alive (deleted null) lives on; one that lived no time at all is not counted."""
    lived = [e for e in lifetimes if e.get("deleted") is None or float(e["deleted"]) > float(e["created"])]
    edges = sorted(
        [(float(e["created"]), 1, f"{e['id']}@{e['created']}") for e in lived]
        + [(float(e["deleted"]), 0, f"{e['id']}@{e['created']}") for e in lived if e.get("deleted") is not None]
    )  # at equal times the deletion (0) comes first
    alive: set[str] = set()
    most: list[str] = []
    for _, created, mid in edges:
        if created:
            alive.add(mid)
            most = sorted(alive) if len(alive) > len(most) else most
        else:
            alive.discard(mid)
    return len(most), most


class RunningLocalCloud:
    """What running_localcloud yields."""

    def __init__(self, lc: LocalCloud) -> None:
        self._lc = lc
        self.api_endpoint = lc.api_endpoint
        self.gcs_endpoint = lc.gcs_endpoint
        self.container_endpoint = lc.container_endpoint
        self.project = lc.project
        self.scenario = lc.scenario
        self.state_dir = lc.state_dir
        self.admin = Admin(lc.api_endpoint)

    def connection_extra(self) -> dict[str, Any]:
        """Extras of a `google_cloud_platform` Airflow connection that reach this cloud (TPU, Compute, GKE)."""
        return {
            "is_anonymous": True,
            "project": self.project,
            "tpu_endpoint": self.api_endpoint,
            "compute_endpoint": self.api_endpoint,
            "container_endpoint": self.container_endpoint,
            "time_scale": self.scenario.time_scale,
        }

    def airflow_conn_env(self, conn_id: str = "google_cloud_default") -> dict[str, str]:
        """`AIRFLOW_CONN_<ID>` environment variable for that connection (no metadata database needed)."""
        return {
            f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(
                {"conn_type": "google_cloud_platform", "extra": self.connection_extra()}
            )
        }

    def cloud_gke(self) -> Any:
        """The in-process GKE state (clusters, their stores): for benchmarks and kubelet-like test helpers."""
        return self._lc.gke

    @property
    def cloud(self) -> Any:
        """The in-process state (for assertions only; drive the cloud through its APIs)."""
        return self._lc.cloud

    @property
    def violations(self) -> list[str]:
        """Strict-mode schema violations and internal errors seen so far."""
        return list(self._lc.cloud.violations)

    def stop(self) -> None:
        self._lc.stop()


@contextmanager
def running_localcloud(
    scenario: str | Path | Scenario = "default", state_dir: Path | None = None, strict: bool = True, gcs: bool = True
) -> Iterator[RunningLocalCloud]:
    """Start a local cloud on free ports (API in-process, GCS emulator as a child process).

    `scenario` is a shipped scenario name, a YAML path or a Scenario. In strict mode every answer is
    validated against Google's discovery documents and a violation becomes a 500 the client sees.
    """
    sc = scenario if isinstance(scenario, Scenario) else scenario_mod.load(scenario)
    lc = LocalCloud(sc, state_dir=state_dir, strict=strict, gcs=gcs).start()
    try:
        yield RunningLocalCloud(lc)
    finally:
        lc.stop()
