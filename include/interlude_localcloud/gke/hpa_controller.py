"""The HPA controller: for each autoscaling/v2 HorizontalPodAutoscaler with a `Pods` metric, scrape the
target's pods' `/metrics` (what Managed Prometheus collects and the custom-metrics adapter serves on
Google), run policy/hpa.py and set the Deployment's replicas and the HPA's status.

A metric named `prometheus.googleapis.com|vllm:num_requests_waiting|gauge` (the adapter's name for a
Managed Prometheus series, https://cloud.google.com/stackdriver/docs/managed-prometheus/hpa) is read as the
Prometheus series `vllm:num_requests_waiting`, summed over its label sets per pod.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import requests

from interlude_localcloud.gke.deployments import DEPLOYMENTS, PODS
from interlude_localcloud.gke.loopback import loopback_session
from interlude_localcloud.gke.policy import hpa
from interlude_localcloud.gke.policy.manifests import parse_quantity
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store

HPAS = next(r for r in RESOURCES if r.plural == "horizontalpodautoscalers")
SCRAPE_TIMEOUT = 1.0
# The HPA controller syncs every 15 s (kube-controller-manager's --horizontal-pod-autoscaler-sync-period, default
# 15s), in the scenario's scaled time; not on every tick of the cluster's loop, each of which scraped every pod.
# https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#how-does-a-horizontalpodautoscaler-work
SYNC_PERIOD_SECONDS = 15.0


@dataclass(frozen=True)
class PodsMetric:
    series: str  # the Prometheus series name
    target: float  # AverageValue


def metric_of(spec: dict[str, Any]) -> PodsMetric | None:
    for m in spec.get("metrics") or []:
        pods = m.get("pods") or {}
        target = pods.get("target") or {}
        if m.get("type") == "Pods" and target.get("type") == "AverageValue":
            name = str((pods.get("metric") or {}).get("name", ""))
            return PodsMetric(
                name.split("|")[1] if name.count("|") == 2 else name, parse_quantity(target["averageValue"])
            )
    return None


def _rules(raw: dict[str, Any] | None, default: hpa.ScalingRules) -> hpa.ScalingRules:
    if not raw:
        return default
    policies = (
        tuple(hpa.ScalingPolicy(p["type"], int(p["value"]), int(p["periodSeconds"])) for p in raw.get("policies") or [])
        or default.policies
    )
    return hpa.ScalingRules(
        int(raw.get("stabilizationWindowSeconds", default.stabilization_window_seconds)),
        policies,
        raw.get("selectPolicy", "Max"),
    )


def hpa_spec(spec: dict[str, Any], metric: PodsMetric) -> hpa.HpaSpec:
    behavior = spec.get("behavior") or {}
    return hpa.HpaSpec(
        int(spec.get("minReplicas", 1)),
        int(spec["maxReplicas"]),
        metric.target,
        _rules(behavior.get("scaleUp"), hpa.DEFAULT_SCALE_UP),
        _rules(behavior.get("scaleDown"), hpa.DEFAULT_SCALE_DOWN),
    )


def series_sum(text: str, series: str) -> float | None:
    """Sum of a series' samples in Prometheus text format (None when the pod does not export it)."""
    total, found = 0.0, False
    pattern = re.compile(r"^" + re.escape(series) + r"(\{[^}]*\})?\s+(\S+)")
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            total += float(m.group(2))
            found = True
    return total if found else None


def scrape(port: int, series: str, http: requests.Session) -> float | None:
    try:
        r = http.get(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT)
        return series_sum(r.text, series) if r.ok else None
    except requests.RequestException:
        return None


class HpaController:
    def __init__(self, store: Store, port_of: Callable[[str], int | None]) -> None:
        self.store = store
        self.port_of = port_of  # pod uid -> its loopback port (None: not running)
        self.states: dict[str, hpa.HpaState] = {}
        self.http = loopback_session()  # used by the cluster's reconcile thread only
        self.synced_at = float("-inf")

    def reconcile(self, now: float) -> None:
        if now - self.synced_at < SYNC_PERIOD_SECONDS:
            return
        self.synced_at = now
        hpas, _ = self.store.list(HPAS, None)
        for h in hpas:
            try:
                self._one(h, now)
            except (KubeError, KeyError, ValueError):
                continue

    def _one(self, h: dict[str, Any], now: float) -> None:
        spec, ns = h.get("spec") or {}, h["metadata"]["namespace"]
        ref = spec.get("scaleTargetRef") or {}
        metric = metric_of(spec)
        if ref.get("kind") != "Deployment" or metric is None:
            return
        d = self.store.get(DEPLOYMENTS, ns, ref["name"])
        selector = ((d.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        pods, _ = self.store.list(
            PODS, ns, lambda p: all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
        )
        samples = []
        for p in pods:
            port = self.port_of(p["metadata"]["uid"])
            phase = (p.get("status") or {}).get("phase", "Pending")
            samples.append(
                hpa.PodSample(
                    p["metadata"]["name"],
                    scrape(port, metric.series, self.http) if port else None,
                    phase if phase in ("Pending", "Running", "Failed") else "Unknown",
                )
            )
        current = int((d.get("spec") or {}).get("replicas", 1))
        key = f"{ns}/{h['metadata']['name']}"
        decision = hpa.reconcile(hpa_spec(spec, metric), current, samples, self.states.get(key, hpa.HpaState()), now)
        self.states[key] = decision.state
        if decision.desired != current:
            self._set(DEPLOYMENTS, ns, ref["name"], lambda o: o["spec"].__setitem__("replicas", decision.desired))
        self._status(h, current, decision, metric, now)

    def _status(
        self, h: dict[str, Any], current: int, decision: hpa.HpaDecision, metric: PodsMetric, now: float
    ) -> None:
        old = h.get("status") or {}
        status: dict[str, Any] = {"currentReplicas": current, "desiredReplicas": decision.desired}
        if decision.metric_average is not None:
            name = ((h["spec"]["metrics"][0].get("pods") or {}).get("metric") or {}).get("name", metric.series)
            status["currentMetrics"] = [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": name},
                        "current": {"averageValue": f"{round(decision.metric_average * 1000)}m"},
                    },
                }
            ]
        last = old.get("lastScaleTime")
        if decision.desired != current:
            last = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if last:
            status["lastScaleTime"] = last
        if status != old:
            self._set(
                HPAS,
                h["metadata"]["namespace"],
                h["metadata"]["name"],
                lambda o: o.__setitem__("status", status),
                "status",
            )

    def _set(self, rt: Any, ns: str, name: str, change: Callable[[dict[str, Any]], None], sub: str = "") -> None:
        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            change(cur)
            cur["metadata"].pop("resourceVersion", None)
            return cur

        self.store.update(rt, ns, name, mutate, sub)
