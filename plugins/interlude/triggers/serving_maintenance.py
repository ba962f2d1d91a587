"""The serving DAG's maintenance watcher: a trigger that polls the cluster asynchronously, carries out the
steps of the pure `maintenance_plan` (cordon, surge a replacement, wait until it is Ready elsewhere, evict
through the Eviction API, start the maintenance, restore the normal shape, uncordon) and yields one event.

GKE marks a TPU/GPU node with pending host maintenance ``cloud.google.com/scheduled-maintenance-time`` and
starts maintenance then, or at once when the node is labelled ``cloud.google.com/perform-maintenance=true``
(https://cloud.google.com/kubernetes-engine/docs/concepts/handle-disruption-gpu-tpu). Evictions go through
``pods/{name}/eviction`` so a PodDisruptionBudget is honoured: a 429 answer means "not now", retried at the
next poll (https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/).

What the watcher changed lives in the cluster, not in the trigger: the surge per node in the HPA's
annotation, the cordon in the node's, so a restarted trigger (or the next run) knows what to undo. The
surge raises the HPA's minReplicas and maxReplicas (the HPA owns the Deployment's replica count, so patching
the Deployment would be undone at its next sync).

Optionally (`load_requests` > 0) it runs a bounded load through the Service during the watch (a drill):
completions through the API server's Service proxy, counted and timed. Meanwhile a `PodObserver` watches the
serving pods from the apply's resourceVersion and follows each running pod's access log, so the report's pods
over time and requests per accelerator hold every change and every answered request (`serving_observer`).

Bounded: the watch ends at `watch_until` once nothing is in flight, and in any case at `deadline` (then the
event is `timeout` and the operator fails, naming what was still in flight).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent
from kubernetes_asyncio import client as async_client

from interlude.serving.loadgen import LOAD_MAX_TOKENS, LOAD_PROMPT, LoadResult, run_load
from interlude.serving.observe import accelerator_of, node_obs, pod_obs
from interlude.serving.policy import CORDON_ANNOTATION, LABEL_PERFORM, SURGE_ANNOTATION, Step, in_flight
from interlude.serving.spec import ServeSpec
from interlude.triggers.serving import _ClusterTrigger, _get_or_none, _json
from interlude.triggers.serving_observer import PodObserver

MERGE = "application/merge-patch+json"
MAX_DECISIONS = 200


def quantity(value: Any) -> float:
    """A Kubernetes quantity as the HPA reports metrics ("500m", "2", "1k") -> float."""
    text = str(value or "0").strip()
    for suffix, factor in (("m", 1e-3), ("k", 1e3), ("M", 1e6)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


class _Cluster:
    """The Kubernetes reads and writes one watch makes (kubernetes_asyncio, raw JSON)."""

    def __init__(self, api: async_client.ApiClient, spec: ServeSpec) -> None:
        self.api, self.spec = api, spec
        self.core = async_client.CoreV1Api(api)
        self.hpas = async_client.AutoscalingV2Api(api)
        self.apps = async_client.AppsV1Api(api)

    async def observe(self) -> dict[str, Any]:
        ns, name = self.spec.namespace, self.spec.name
        nodes = (await _json(self.core.list_node))["items"]
        selector = f"app.kubernetes.io/name={name}"
        pods = (await _json(self.core.list_namespaced_pod, ns, label_selector=selector))["items"]
        hpa = await _get_or_none(self.hpas.read_namespaced_horizontal_pod_autoscaler, name, ns)
        deployment = await _get_or_none(self.apps.read_namespaced_deployment, name, ns)
        return {"nodes": nodes, "pods": pods, "hpa": hpa, "deployment": deployment}

    async def patch_node(self, name: str, body: dict[str, Any]) -> str:
        """Patch a node; a node gone since the observation (GKE's autoscaler removes empty nodes, a repaired node
        is replaced) has nothing left to cordon, uncordon or maintain: said, not raised."""
        try:
            # _content_type is accepted at run time (the generated client's common kwargs), not in its typed signature.
            await self.core.patch_node(name, body, _content_type=MERGE)  # type: ignore[call-arg]
        except async_client.ApiException as exc:
            if exc.status == 404:
                return f"{name} is gone (removed since the observation): nothing to do"
            raise
        return ""

    async def resize(self, node: str, delta: int) -> None:
        """Surge (+) or restore (-) by `delta` replicas for `node`, remembered in the HPA's annotation."""
        hpa = await _json(self.hpas.read_namespaced_horizontal_pod_autoscaler, self.spec.name, self.spec.namespace)
        spec = hpa["spec"]
        surged = _surged(hpa)
        left = surged.get(node, 0) + delta
        surged = {k: v for k, v in {**surged, node: left}.items() if v > 0}
        body = {
            "metadata": {"annotations": {SURGE_ANNOTATION: json.dumps(surged, sort_keys=True) if surged else None}},
            "spec": {
                "minReplicas": max(1, int(spec.get("minReplicas", 1)) + delta),
                "maxReplicas": max(1, int(spec["maxReplicas"]) + delta),
            },
        }
        patch = self.hpas.patch_namespaced_horizontal_pod_autoscaler
        await patch(self.spec.name, self.spec.namespace, body, _content_type=MERGE)  # type: ignore[call-arg]

    async def evict(self, pod: dict[str, Any]) -> str:
        name = pod["metadata"]["name"]
        body = async_client.V1Eviction(metadata=async_client.V1ObjectMeta(name=name, namespace=self.spec.namespace))
        try:
            await self.core.create_namespaced_pod_eviction(name, self.spec.namespace, body)
        except async_client.ApiException as exc:
            if exc.status == 429:
                return f"eviction of {name} refused by its disruption budget (429): retried at the next poll"
            if exc.status == 404:
                return f"{name} already gone"
            raise
        return f"evicted {name}"

    async def complete(self) -> None:
        """One completion through the Service (API server proxy); raises unless it answers 200 with a choice."""
        body = {"model": self.spec.served_model_name, "prompt": LOAD_PROMPT, "max_tokens": LOAD_MAX_TOKENS}
        resp = await self.api.call_api(
            f"/api/v1/namespaces/{self.spec.namespace}/services/{self.spec.name}/proxy/v1/completions",
            "POST",
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
            _request_timeout=60,
        )
        data = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {data[:200].decode(errors='replace')}")
        if not json.loads(data).get("choices"):
            raise RuntimeError("answer without choices")


def _surged(hpa: dict[str, Any] | None) -> dict[str, int]:
    raw = ((hpa or {}).get("metadata", {}).get("annotations") or {}).get(SURGE_ANNOTATION)
    try:
        data = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _waiting(hpa: dict[str, Any] | None) -> float:
    """The HPA's own reading of the average waiting requests per pod (0 before its first reading)."""
    for metric in ((hpa or {}).get("status") or {}).get("currentMetrics") or []:
        current = (metric.get("pods") or {}).get("current") or {}
        if "averageValue" in current:
            return quantity(current["averageValue"])
    return 0.0


class MaintenanceWatchTrigger(_ClusterTrigger):
    """Watch the serving pods' nodes for maintenance until `watch_until` (and nothing in flight) or `deadline`.

    :param spec: the ServeSpec as a dict (the maintenance policy's settings, the load's size).
    :param watch_until: stop watching at this wall-clock time, in epoch seconds, once no maintenance step is
        in flight and the load (if any) has finished.
    :param pods_since: the resourceVersion the apply step listed the pods at, where the pod watch starts;
        "" starts it from now.
    :param time_scale: how much faster than Google's clock the cluster's cloud runs (the connection's
        ``time_scale``; 1 = Google): the policy's margins are Google-real seconds, the nodes' labels epoch seconds.
    :param gcp_conn_id: the Google connection GKEHook reaches the cluster through.
    :param project_id: the cluster's Google Cloud project.
    :param location: the cluster's region or zone.
    :param cluster: the GKE cluster's name.
    :param namespace: the Kubernetes namespace of the serving objects.
    :param name: the name the spec's objects share (Deployment, Service, ComputeClass, HPA; the pods' label).
    :param deadline: end the wait with ``timeout`` after this wall-clock time, in epoch seconds.
    :param poll_interval: wall-clock seconds between two polls.
    """

    def __init__(
        self, *, spec: dict[str, Any], watch_until: float, pods_since: str = "", time_scale: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.kw.update({"spec": spec, "watch_until": watch_until, "pods_since": pods_since, "time_scale": time_scale})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        spec = ServeSpec.from_dict(self.kw["spec"])
        decisions: list[dict[str, Any]] = []
        load_task: asyncio.Task[LoadResult] | None = None
        observer: PodObserver | None = None
        try:
            kube = await asyncio.to_thread(self._async_hook)
            async with kube.get_conn() as api:
                cluster = _Cluster(api, spec)
                selector = f"app.kubernetes.io/name={spec.name}"
                observer = PodObserver(cluster.core, spec.namespace, selector, self.kw.get("pods_since") or "").start()
                if spec.load_requests:
                    load_task = asyncio.create_task(
                        run_load(
                            cluster.complete,
                            count=spec.load_requests,
                            concurrency=spec.load_concurrency,
                            deadline=self.kw["watch_until"],
                        )
                    )
                status, steps = await self._watch(cluster, spec, decisions, load_task)
                load = (await load_task).to_dict() if load_task and load_task.done() else None
                observed = await observer.stop()
            pending = [f"{s.kind} {s.node}: {s.reason}" for s in steps]
            yield TriggerEvent(
                {"status": status, "decisions": decisions, "load": load, "observed": observed, "in_flight": pending}
            )
        except Exception as exc:  # noqa: BLE001 - execute_complete fails loudly with it
            if load_task is not None:
                load_task.cancel()
            if observer is not None:
                await observer.stop()
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}", "decisions": decisions})

    async def _watch(
        self,
        cluster: _Cluster,
        spec: ServeSpec,
        decisions: list[dict[str, Any]],
        load_task: asyncio.Task[LoadResult] | None,
    ) -> tuple[str, list[Step]]:
        last: set[tuple[str, str, str]] = set()
        while True:
            steps = await self._tick(cluster, spec, decisions, last)
            last = {(s.kind, s.node, s.reason) for s in steps}
            load_done = load_task is None or load_task.done()
            if time.time() >= self.kw["watch_until"] and not in_flight(steps) and load_done:
                return "done", steps
            if time.time() > self.kw["deadline"]:
                return "timeout", steps
            await asyncio.sleep(self.kw["poll_interval"])

    async def _tick(
        self, cluster: _Cluster, spec: ServeSpec, decisions: list[dict[str, Any]], last: set[tuple[str, str, str]]
    ) -> list[Step]:
        from interlude.serving.policy import maintenance_plan

        seen = await cluster.observe()
        accelerators = {n["metadata"]["name"]: accelerator_of(n["metadata"].get("labels") or {}) for n in seen["nodes"]}
        hpa, deployment = seen["hpa"], seen["deployment"]
        desired = max(
            int(((deployment or {}).get("spec") or {}).get("replicas", 1)),
            int(((hpa or {}).get("spec") or {}).get("minReplicas", 1)),
        )
        steps = maintenance_plan(
            [node_obs(n) for n in seen["nodes"]],
            [pod_obs(p, accelerators) for p in seen["pods"]],
            time.time(),
            spec,
            desired_replicas=desired,
            waiting_requests=_waiting(hpa),
            surged=_surged(hpa),
            time_scale=float(self.kw.get("time_scale") or 1.0),
        )
        for step in steps:
            outcome = await self._act(cluster, step, seen)
            if (step.kind, step.node, step.reason) not in last or step.kind not in ("wait", "none"):
                self.log.info(
                    "maintenance %s %s: %s%s", step.kind, step.node, step.reason, f" ({outcome})" * bool(outcome)
                )
                if len(decisions) < MAX_DECISIONS:
                    decisions.append(
                        {
                            "at": time.time(),
                            "kind": step.kind,
                            "node": step.node,
                            "reason": step.reason,
                            "outcome": outcome,
                        }
                    )
        return steps

    async def _act(self, cluster: _Cluster, step: Step, seen: dict[str, Any]) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if step.kind == "cordon":
            return await cluster.patch_node(
                step.node, {"metadata": {"annotations": {CORDON_ANNOTATION: stamp}}, "spec": {"unschedulable": True}}
            )
        if step.kind == "uncordon":
            return await cluster.patch_node(
                step.node, {"metadata": {"annotations": {CORDON_ANNOTATION: None}}, "spec": {"unschedulable": None}}
            )
        if step.kind == "perform_maintenance":
            return await cluster.patch_node(step.node, {"metadata": {"labels": {LABEL_PERFORM: "true"}}})
        if step.kind in ("surge", "restore") and seen["hpa"] is not None:
            await cluster.resize(step.node, step.count if step.kind == "surge" else -step.count)
        elif step.kind == "drain":
            return await self._drain(cluster, step.node, seen)
        return ""

    async def _drain(self, cluster: _Cluster, node: str, seen: dict[str, Any]) -> str:
        outcomes = []
        for pod in seen["pods"]:
            if pod["spec"].get("nodeName") == node and (pod.get("status") or {}).get("phase") in ("Pending", "Running"):
                outcomes.append(await cluster.evict(pod))
        return "; ".join(outcomes)
