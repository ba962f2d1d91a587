"""GkeStageTrigger: watch a stage running in the run's JobSet on GKE until the operator has something to do.

Each poll reads the JobSet (its Failed condition), its pods, their nodes (GKE's maintenance labels and the
impending-termination taint) through the Google provider's ``GKEKubernetesAsyncHook`` (kubernetes_asyncio), and
the stage's GCS facts (committed step, progress.json, the answer to a checkpoint request) in a thread; the pure
``interlude.stage.gke_observe.next_gke_step`` says what they mean. It yields one event when the operator must
act (request a checkpoint, record an event, complete, fail) or when watching itself fails; the state travels in
the event, so a duplicate copy of the trigger or a restarted triggerer re-derives the same from the cluster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from interlude.stage.gke_observe import GkeObservation, GkeStageState, next_gke_step, observation_from

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


class GkeStageTrigger(BaseTrigger):
    """Poll the stage's JobSet, pods, nodes and GCS facts; one event when the operator must act.

    :param machine: the machine record (kind ``gke_jobset``: cluster, location, namespace, jobset).
    :param bucket: the run's bucket.
    :param run_key: the run's key.
    :param stage: the stage's name.
    :param state: the GkeStageState as a dict.
    :param poll_interval: real seconds between two looks.
    :param stall_timeout: real seconds without progress (no maintenance under way) before the stage fails.
    :param down_timeout: real seconds a drained workload may take to come back before the stage fails.
    :param gcp_conn_id: the Google connection GKEHook reaches the cluster through.
    """

    def __init__(
        self,
        *,
        machine: dict[str, Any],
        bucket: str,
        run_key: str,
        stage: str,
        state: dict[str, Any],
        poll_interval: float,
        stall_timeout: float,
        down_timeout: float,
        gcp_conn_id: str = "google_cloud_default",
    ) -> None:
        super().__init__()
        self.kw: dict[str, Any] = {
            "machine": machine,
            "bucket": bucket,
            "run_key": run_key,
            "stage": stage,
            "state": state,
            "poll_interval": poll_interval,
            "stall_timeout": stall_timeout,
            "down_timeout": down_timeout,
            "gcp_conn_id": gcp_conn_id,
        }

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return f"{type(self).__module__}.{type(self).__qualname__}", dict(self.kw)

    def _async_hook(self) -> Any:
        from interlude.hooks.gke import GKEHook

        m = self.kw["machine"]
        return GKEHook(gcp_conn_id=self.kw["gcp_conn_id"], location=m["location"]).kubernetes_async_hook(m["cluster"])

    async def observe(self, api: Any, state: GkeStageState) -> GkeObservation:
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        from interlude.stage.observe import read_stage_facts

        m, kw = self.kw["machine"], self.kw
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        try:
            jobset = await custom.get_namespaced_custom_object(
                "jobset.x-k8s.io", "v1alpha2", m["namespace"], "jobsets", m["jobset"]
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            jobset = None
        pods = await core.list_namespaced_pod(m["namespace"], label_selector=f"{JOBSET_LABEL}={m['jobset']}")
        raw_pods = [api.sanitize_for_serialization(p) for p in pods.items]
        nodes = []
        names = {str(n) for p in raw_pods if (n := (p.get("spec") or {}).get("nodeName"))}
        for name in sorted(names):
            try:
                nodes.append(api.sanitize_for_serialization(await core.read_node(name)))
            except ApiException as exc:
                if exc.status != 404:  # a node GKE replaced is gone: nothing to read
                    raise
        pod_events: list[Any] = []
        if any((p.get("status") or {}).get("phase") == "Pending" for p in raw_pods):  # the autoscaler's word on it
            listed = await core.list_namespaced_event(m["namespace"], field_selector="involvedObject.kind=Pod")
            pod_events = [api.sanitize_for_serialization(e) for e in listed.items]
        final = state.target_step if state.awaits_export else None
        facts = await asyncio.to_thread(
            read_stage_facts, kw["bucket"], kw["run_key"], kw["stage"], state.request_id, final
        )
        return observation_from(
            time.time(),
            raw_pods,
            nodes,
            facts.committed_step,
            facts.progress,
            facts.request_ack_step,
            jobset,
            pod_events,
            export_committed=facts.export_committed,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        state = GkeStageState.from_dict(self.kw["state"])
        try:
            kube = await asyncio.to_thread(self._async_hook)
            async with kube.get_conn() as api:
                while True:
                    obs = await self.observe(api, state)
                    step = next_gke_step(state, obs, self.kw["stall_timeout"], self.kw["down_timeout"])
                    if step.actions:
                        yield TriggerEvent(
                            {
                                "status": "transition",
                                "state": step.state.to_dict(),
                                "actions": list(step.actions),
                                "event": step.event,
                                "reason": step.reason,
                            }
                        )
                        return
                    if step.state.phase != state.phase or step.state.boot_id != state.boot_id:
                        self.log.info("[%s] %s", self.kw["stage"], step.reason)
                    state = step.state
                    await asyncio.sleep(self.kw["poll_interval"])
        except Exception as exc:  # noqa: BLE001 - execute_complete fails loudly with it
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
