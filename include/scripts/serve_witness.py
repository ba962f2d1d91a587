"""What `make demo-serve` sees of the cluster while the serving DAG runs, read from the Kubernetes API itself.

The DAG's report is the DAG's account; the demo also keeps its own: a background poller that records which
accelerator each serving pod was Ready on over time, the cluster clock when a replica first turned Ready on an
L4 node (for the stockout figure) and, when asked, the moment the TPU replica has answered some of the load
(when the demo schedules the TPU node's maintenance). After the run: processes still alive that belong to the
local cloud's state directory (a pod's process carries that directory in its PATH).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NS = "default"
NAME = "interlude-vllm"
SELECTOR = f"app.kubernetes.io/name={NAME}"
TPU_LABEL = "cloud.google.com/gke-tpu-accelerator"
GPU_LABEL = "cloud.google.com/gke-accelerator"


def accelerator(labels: dict[str, str]) -> str | None:
    return "tpu" if TPU_LABEL in labels else "gpu" if GPU_LABEL in labels else None


def is_ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


@dataclass
class Seen:
    """Everything the poller saw; times are real seconds since the witness started unless named `cluster`."""

    timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # Ready pods per accelerator
    ready_on: dict[str, str] = field(default_factory=dict)  # pod -> accelerator it was Ready on
    node_kind: dict[str, str | None] = field(default_factory=dict)
    pod_node: dict[str, str] = field(default_factory=dict)
    first_gpu_ready_cluster: float | None = None
    per_node: int = 0  # the most serving pods (Pending or Running) seen on one node at once
    polls: int = 0
    errors: int = 0

    def peak(self, kind: str) -> int:
        return max((counts.get(kind, 0) for _, counts in self.timeline), default=0)


class Witness:
    """Polls nodes and the serving pods every `every` seconds in a daemon thread until stopped."""

    def __init__(self, api: Any, admin: Any, cluster: str, every: float = 0.5) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.admin = admin
        self.cluster = cluster
        self.every = every
        self.seen = Seen()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="serve-witness", daemon=True)

    def start(self) -> Witness:
        self._thread.start()
        return self

    def stop(self) -> Seen:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.seen

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.look()
            except Exception:  # noqa: BLE001 - a poll may hit the API server while it is busy; the next one counts
                self.seen.errors += 1

    def look(self) -> list[Any]:
        with self._lock:
            for node in self.core.list_node().items:
                self.seen.node_kind[node.metadata.name] = accelerator(node.metadata.labels or {})
            pods = self.core.list_namespaced_pod(NS, label_selector=SELECTOR).items
            counts: dict[str, int] = {}
            on_node: dict[str, int] = {}
            for pod in pods:
                self._record(pod, counts)
                if pod.spec.node_name and pod.status.phase in ("Pending", "Running"):
                    on_node[pod.spec.node_name] = on_node.get(pod.spec.node_name, 0) + 1
            self.seen.per_node = max([self.seen.per_node, *on_node.values()])
            self.seen.polls += 1
            if not self.seen.timeline or self.seen.timeline[-1][1] != counts:
                self.seen.timeline.append((round(time.monotonic() - self.started, 1), counts))
            return list(pods)

    def _record(self, pod: Any, counts: dict[str, int]) -> None:
        node = pod.spec.node_name
        if not node:
            return
        self.seen.pod_node[pod.metadata.name] = node
        kind = self.seen.node_kind.get(node)
        if not (kind and is_ready(pod)):
            return
        counts[kind] = counts.get(kind, 0) + 1
        self.seen.ready_on.setdefault(pod.metadata.name, kind)
        if kind == "gpu" and self.seen.first_gpu_ready_cluster is None:
            self.seen.first_gpu_ready_cluster = float(self.admin.gke_events(self.cluster)["now"])

    def ready_now(self) -> dict[str, int]:
        """Ready serving pods per accelerator at the last poll."""
        return dict(self.seen.timeline[-1][1]) if self.seen.timeline else {}

    def tpu_replica_under_load(self, served_at_least: int = 5) -> tuple[str, str] | None:
        """(pod, node) of a Ready TPU replica whose own access log shows it answered the load, else None."""
        from interlude.serving.loadgen import served_completions

        for pod in self.look():
            node = pod.spec.node_name
            if node and self.seen.node_kind.get(node) == "tpu" and is_ready(pod):
                log = self.core.read_namespaced_pod_log(pod.metadata.name, NS, container="vllm-tpu")
                if served_completions(log)[0] >= served_at_least:
                    return pod.metadata.name, node
        return None


def first_stockout(admin: Any, cluster: str) -> float | None:
    """Cluster time of the autoscaler's first failed TPU scale-up (its own event log)."""
    failed = [float(e["t"]) for e in admin.gke_events(cluster)["events"] if e["kind"] == "ScaleUpFailed"]
    return min(failed) if failed else None


def processes_of(state_dir: Path) -> list[int]:
    """Live processes whose environment names the local cloud's state directory (pods' PATH and device root)."""
    needle = str(state_dir.resolve()).encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle in (proc / "environ").read_bytes():
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found
