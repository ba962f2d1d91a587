"""One reconcile loop per cluster, in the local cloud's process: maintenance -> autoscaler -> scheduler ->
kubelet (pods as processes) -> Services (loopback proxies). It wakes on store writes or every TICK seconds;
policy time is the scenario's scaled clock (real seconds x time_scale), so a 10-minute consolidation delay
takes 1 s at time_scale 600. Stopping it stops every pod's process groups (no orphans)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from interlude_localcloud.gke.containers import NodeHost, node_host
from interlude_localcloud.gke.controllers import NODES, PODS, CapacityFn, Controllers
from interlude_localcloud.gke.deployments import is_ready
from interlude_localcloud.gke.hpa_controller import HpaController
from interlude_localcloud.gke.kubelet import PodEnv, PodRunner
from interlude_localcloud.gke.proxy import ServiceProxy
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import WatchEvent

SERVICES = next(r for r in RESOURCES if r.plural == "services")
PORT_ANNOTATION = "localcloud.interlude.dev/loopback-port"  # where a Service listens on 127.0.0.1
TICK = 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClusterRuntime:
    def __init__(
        self,
        cluster: Any,
        state_dir: Path,
        time_scale: float,
        resize_delay: float,
        extra_env: dict[str, str],
        free_units: CapacityFn | None = None,
        tpu_fallback_wait: float = 0.0,
    ) -> None:
        self.c = cluster
        self.store = cluster.kube.store
        self.dir = state_dir / "gke" / cluster.spec.name
        self.time_scale = time_scale
        self.controllers = Controllers(cluster, resize_delay, free_units, tpu_fallback_wait)
        self.hpa = HpaController(self.store, self._port_of)
        self.extra_env = extra_env
        self.runners: dict[str, PodRunner] = {}  # pod uid -> runner
        self.started: list[PodRunner] = []  # every runner ever started (for pids())
        self.proxies: dict[tuple[str, str], ServiceProxy] = {}
        self.hosts: dict[str, NodeHost] = {}
        self.lock = threading.RLock()
        self._t0, self._m0 = time.time(), time.monotonic()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._unsubscribe: list[Any] = []
        self._stopping: list[threading.Thread] = []  # runners being stopped after their pod went away
        self._to_stop: list[threading.Thread] = []  # started once the Services no longer send them traffic

    def now(self) -> float:
        """Scenario time: starts at the wall clock, runs time_scale times faster."""
        return self._t0 + (time.monotonic() - self._m0) * self.time_scale

    def start(self) -> None:
        for rt in (PODS, NODES, SERVICES):
            _, unsubscribe = self.store.watch(rt, None, self.store.resource_version, self._poke)
            self._unsubscribe.append(unsubscribe)
        self._thread = threading.Thread(target=self._run, name=f"gke-runtime-{self.c.spec.name}", daemon=True)
        self._thread.start()

    def _poke(self, _ev: WatchEvent) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self.lock:
            self.runners = {}
            runners = list(self.started)  # every runner ever started: one scaled away may still be stopping
            proxies, self.proxies = list(self.proxies.values()), {}
            pending = [t for t in self._stopping if t.ident is not None]  # started ones (others: stoppers below)
        stoppers = [threading.Thread(target=r.stop, args=(2.0,)) for r in runners]
        for t in stoppers:
            t.start()
        for t in [*stoppers, *pending]:
            t.join()
        for p in proxies:
            p.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            due = self.controllers.next_ready_in()  # a booting node turns Ready: reconcile then, not a tick later
            self._wake.wait(TICK if due is None else min(TICK, due + 0.005))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.reconcile()
            except Exception as e:  # noqa: BLE001 - keep reconciling; the event log says what broke
                self.controllers.state.event(self.now(), "ReconcileError", error=repr(e))

    def reconcile(self) -> None:
        with self.lock:
            now = self.now()
            self.controllers.maintain(now)
            self.controllers.autoscale(now)
            self.controllers.schedule(now)
            try:
                self._kubelets()
                self._services()
            finally:
                # A gone pod leaves its Services' endpoints before its containers get SIGTERM (what a preStop
                # pause buys on Kubernetes): no new connection reaches a server that is shutting down.
                for stopper in self._to_stop:
                    stopper.start()
                self._to_stop = []
        self.hpa.reconcile(now)  # scrapes pods over HTTP: outside the lock

    def _port_of(self, uid: str) -> int | None:
        with self.lock:
            runner = self.runners.get(uid)
            return runner.port if runner is not None and runner.phase == "Running" else None

    # ------------------------------------------------------------------ kubelet
    def _host(self, node: dict[str, Any]) -> NodeHost:
        name = node["metadata"]["name"]
        if name not in self.hosts:
            self.hosts[name] = node_host(self.dir / "nodes", name, node["metadata"].get("labels") or {})
        return self.hosts[name]

    def _kubelets(self) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.store.list(NODES, None)[0]}
        pods = {p["metadata"]["uid"]: p for p in self.store.list(PODS, None)[0]}
        for uid in [u for u in self.runners if u not in pods or pods[u]["spec"].get("nodeName") not in nodes]:
            runner = self.runners.pop(uid)
            stopper = threading.Thread(target=runner.stop, name=f"stop-{runner.name}", daemon=True)
            self._stopping = [t for t in self._stopping if t.is_alive()] + [stopper]
            self._to_stop.append(stopper)
        for uid, pod in pods.items():
            node = pod["spec"].get("nodeName")
            if not node:
                continue
            if node not in nodes:
                self.controllers.evict(pod)  # pod GC: bound to a node that is gone
                continue
            if uid not in self.runners:
                env = PodEnv(self.store, self.c.spec.images, self.c.kube.port, self.c.kube.tls.ca_pem, self.extra_env)
                runner = PodRunner(
                    env,
                    pod,
                    self._host(nodes[node]),
                    self.dir / "pods" / f"{pod['metadata']['name']}-{uid[:8]}",
                    free_port(),
                )
                self.runners[uid] = runner
                self.started.append(runner)
                runner.start()

    def pids(self) -> list[int]:
        """Every container process started so far (alive or not): for checks that none outlives the cloud."""
        with self.lock:
            return [pid for r in self.started for pid in r.all_pids()]

    # ------------------------------------------------------------------ services
    def _services(self) -> None:
        services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in self.store.list(SERVICES, None)[0]}
        for key in [k for k in self.proxies if k not in services]:
            self.proxies.pop(key).close()
        by_uid = {r.pod["metadata"]["uid"]: r for r in self.runners.values()}
        pods = self.store.list(PODS, None)[0]
        for key, svc in services.items():
            proxy = self.proxies.get(key)
            if proxy is None:
                proxy = self.proxies[key] = ServiceProxy(key[1])
            selector = (svc.get("spec") or {}).get("selector") or {}
            ports = []
            for pod in pods:
                runner = by_uid.get(pod["metadata"]["uid"])
                if (
                    selector
                    and pod["metadata"]["namespace"] == key[0]
                    and runner is not None
                    and is_ready(pod)
                    and _selects(selector, pod["metadata"].get("labels") or {})
                ):
                    ports.append(runner.port)
            proxy.set_backends(ports)
            if (svc["metadata"].get("annotations") or {}).get(PORT_ANNOTATION) != str(proxy.port):
                self._annotate(svc, proxy.port)

    def _annotate(self, svc: dict[str, Any], port: int) -> None:
        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            cur["metadata"].setdefault("annotations", {})[PORT_ANNOTATION] = str(port)
            cur["metadata"].pop("resourceVersion", None)
            return cur

        try:
            self.store.update(SERVICES, svc["metadata"]["namespace"], svc["metadata"]["name"], mutate)
        except KubeError:
            pass


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
