"""Triggers of the serving DAG: wait for a rollout, wait for a delete to finish. Each polls the cluster's
Kubernetes API asynchronously (kubernetes_asyncio, through the provider's GKEKubernetesAsyncHook) and yields
exactly one event: done, timeout (the deadline passed) or error. The operator's execute_complete fails on
anything but done, so a rollout never waits forever and a failure is never silent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent
from kubernetes_asyncio import client as async_client


async def _json(call: Any, *args: Any, **kwargs: Any) -> Any:
    """A kubernetes_asyncio call's raw JSON (the API's own field names, as the pure core reads them).

    Without preloading the client returns error answers too: a 4xx/5xx is raised as ApiException here."""
    resp = await call(*args, _preload_content=False, **kwargs)
    body = await resp.read()
    if resp.status >= 400:
        raise async_client.ApiException(status=resp.status, reason=body.decode(errors="replace")[:500])
    return json.loads(body)


async def _get_or_none(call: Any, *args: Any) -> Any:
    try:
        return await _json(call, *args)
    except async_client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


class _ClusterTrigger(BaseTrigger):
    """What both triggers share: which cluster (through which connection), the deadline, the poll interval.

    :param gcp_conn_id: the Google connection GKEHook reaches the cluster through.
    :param project_id: the cluster's Google Cloud project.
    :param location: the cluster's region or zone.
    :param cluster: the GKE cluster's name.
    :param namespace: the Kubernetes namespace of the serving objects.
    :param name: the name the spec's objects share (Deployment, Service, ComputeClass, HPA; the pods' label).
    :param deadline: end the wait with ``timeout`` after this wall-clock time, in epoch seconds.
    :param poll_interval: wall-clock seconds between two polls (the operators pass the spec's poll_seconds
        divided by the connection's ``time_scale``, at least 1).
    """

    def __init__(
        self,
        *,
        gcp_conn_id: str,
        project_id: str,
        location: str,
        cluster: str,
        namespace: str,
        name: str,
        deadline: float,
        poll_interval: float,
    ) -> None:
        super().__init__()
        self.kw: dict[str, Any] = {
            "gcp_conn_id": gcp_conn_id,
            "project_id": project_id,
            "location": location,
            "cluster": cluster,
            "namespace": namespace,
            "name": name,
            "deadline": deadline,
            "poll_interval": poll_interval,
        }

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self.kw)

    def _async_hook(self) -> Any:
        from interlude.hooks.gke import GKEHook

        hook = GKEHook(gcp_conn_id=self.kw["gcp_conn_id"], location=self.kw["location"])
        return hook.kubernetes_async_hook(self.kw["cluster"], project_id=self.kw["project_id"])

    async def poll(self, api: async_client.ApiClient) -> tuple[bool, dict[str, Any]]:
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            kube = await asyncio.to_thread(self._async_hook)
            async with kube.get_conn() as api:
                while True:
                    done, detail = await self.poll(api)
                    if done:  # a poll may name another final status (the rollout's "fallback")
                        yield TriggerEvent({"status": "done", **detail})
                        return
                    if time.time() > self.kw["deadline"]:
                        yield TriggerEvent({"status": "timeout", **detail})
                        return
                    self.log.info("Waiting: %s", detail.get("reason"))
                    await asyncio.sleep(self.kw["poll_interval"])
        except Exception as exc:  # noqa: BLE001 - execute_complete fails loudly with it
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})


class RolloutTrigger(_ClusterTrigger):
    """Until the Deployment's newest template is fully Ready; the event lists each pod's accelerator.

    With `fallback` (a FallbackState dict and the ServeSpec dict), each poll also asks
    `policy.fallback_decision` whether pods pending on a TPU stockout should go to GPU (or back): a decision
    other than "none" ends the wait with status "fallback" and the plan; the operator applies the class order
    and defers again. The trigger itself only reads the cluster.

    :param fallback: ``{"state": FallbackState dict, "spec": ServeSpec dict}``; None: no fallback decisions,
        only wait for the rollout.
    :param gcp_conn_id: the Google connection GKEHook reaches the cluster through.
    :param project_id: the cluster's Google Cloud project.
    :param location: the cluster's region or zone.
    :param cluster: the GKE cluster's name.
    :param namespace: the Kubernetes namespace of the serving objects.
    :param name: the name the spec's objects share (Deployment, Service, ComputeClass, HPA; the pods' label).
    :param deadline: end the wait with ``timeout`` after this wall-clock time, in epoch seconds.
    :param poll_interval: wall-clock seconds between two polls.
    """

    def __init__(self, *, fallback: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kw["fallback"] = fallback

    async def poll(self, api: async_client.ApiClient) -> tuple[bool, dict[str, Any]]:
        from interlude.serving.rollout import rollout_state

        ns, name = self.kw["namespace"], self.kw["name"]
        apps, core = async_client.AppsV1Api(api), async_client.CoreV1Api(api)
        deployment = await _get_or_none(apps.read_namespaced_deployment, name, ns)
        selector = ",".join(
            f"{k}={v}"
            for k, v in ((deployment or {}).get("spec", {}).get("selector", {}).get("matchLabels") or {}).items()
        )
        pods = (await _json(core.list_namespaced_pod, ns, label_selector=selector))["items"] if selector else []
        nodes = (await _json(core.list_node))["items"]
        labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {} for n in nodes}
        state = rollout_state(deployment, pods, labels)
        detail: dict[str, Any] = {"reason": state.reason, "pods": [p.to_dict() for p in state.pods]}
        if self.kw.get("fallback"):  # handed back, so the operator keeps it across deferrals
            detail["fallback_state"] = self.kw["fallback"]["state"]
        if state.done or not self.kw.get("fallback") or not pods:
            return state.done, detail
        events = (await _json(core.list_namespaced_event, ns))["items"]
        return self._fallback(pods, events, nodes, detail)

    def _fallback(
        self, pods: list[Any], events: list[Any], nodes: list[Any], detail: dict[str, Any]
    ) -> tuple[bool, dict[str, Any]]:
        from interlude.serving.fallback import FallbackState, decide
        from interlude.serving.spec import ServeSpec

        raw = self.kw["fallback"]
        ours = {p["metadata"]["name"] for p in pods}
        mine = [e for e in events if ((e.get("involvedObject") or e.get("regarding") or {}).get("name")) in ours]
        plan = decide(
            pods, mine, nodes, FallbackState.from_dict(raw["state"]), time.time(), ServeSpec.from_dict(raw["spec"])
        )
        if plan.action == "none":
            return False, {**detail, "reason": f"{detail['reason']}; fallback: {plan.reason}"}
        decision = {
            "action": plan.action,
            "order": plan.order,
            "reason": plan.reason,
            "stuck_pods": list(plan.stuck_pods),
        }
        return True, {**detail, "status": "fallback", "plan": decision, "deadline": self.kw["deadline"]}


class DeletedTrigger(_ClusterTrigger):
    """Until no pod, Service or ComputeClass of the spec is left (`name` is the shared object name).

    :param gcp_conn_id: the Google connection GKEHook reaches the cluster through.
    :param project_id: the cluster's Google Cloud project.
    :param location: the cluster's region or zone.
    :param cluster: the GKE cluster's name.
    :param namespace: the Kubernetes namespace of the serving objects.
    :param name: the name the spec's objects share (Deployment, Service, ComputeClass, HPA; the pods' label).
    :param deadline: end the wait with ``timeout`` after this wall-clock time, in epoch seconds.
    :param poll_interval: wall-clock seconds between two polls.
    """

    async def poll(self, api: async_client.ApiClient) -> tuple[bool, dict[str, Any]]:
        from interlude.serving.rollout import leftovers

        ns, name = self.kw["namespace"], self.kw["name"]
        core, custom = async_client.CoreV1Api(api), async_client.CustomObjectsApi(api)
        pods = (await _json(core.list_namespaced_pod, ns, label_selector=f"app.kubernetes.io/name={name}"))["items"]
        service = await _get_or_none(core.read_namespaced_service, name, ns)
        klass = await _get_or_none(custom.get_cluster_custom_object, "cloud.google.com", "v1", "computeclasses", name)
        left = leftovers(pods, [service] if service else [], [klass] if klass else [])
        return not left, {"reason": f"left: {', '.join(left)}" if left else "nothing left", "left": left}
