"""The serving triggers against a real local GKE API (no pods run in this scenario): a rollout that cannot
finish ends at its deadline with one `timeout` event and the operator's execute_complete fails loudly; a
delete with nothing left is done at once; an unreachable cluster is one `error` event."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException
from airflow.triggers.base import BaseTrigger

from interlude.hooks.gke import GKEHook
from interlude.hooks.kube_objects import KubeObjects
from interlude.operators.serving import ServingRolloutOperator
from interlude.serving.entrypoints import load_scripts
from interlude.serving.plan import require_plan
from interlude.serving.spec import ServeSpec
from interlude.triggers.serving import DeletedTrigger, RolloutTrigger
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION

SPEC = ServeSpec(checkpoint_uri="gs://bucket/interlude/run/finetune/", name="trig-vllm", cluster=CLUSTER)


def events(trigger: BaseTrigger) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        return [e.payload async for e in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=60))


def kwargs(lc: RunningLocalCloud, conn: str, deadline_in: float, **over: Any) -> dict[str, Any]:
    return {
        "gcp_conn_id": conn,
        "project_id": lc.project,
        "location": LOCATION,
        "cluster": CLUSTER,
        "namespace": "default",
        "name": SPEC.name,
        "deadline": time.time() + deadline_in,
        "poll_interval": 0.2,
        **over,
    }


def test_a_rollout_that_cannot_finish_times_out_once_and_fails_loudly(gke_lc: RunningLocalCloud, gke_conn: str) -> None:
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).kubernetes_hook(CLUSTER, project_id=gke_lc.project)
    with hook.get_conn() as api_client:
        kube = KubeObjects(api_client)
        deployment = next(o for o in require_plan(SPEC, scripts=load_scripts()).objects if o["kind"] == "Deployment")
        kube.apply(copy.deepcopy(deployment))  # no pods run in this scenario: it never becomes Ready
        got = events(RolloutTrigger(**kwargs(gke_lc, gke_conn, 1.5)))
        assert [e["status"] for e in got] == ["timeout"]
        assert "replicas" in got[0]["reason"] or "Ready" in got[0]["reason"], got
        op = ServingRolloutOperator(task_id="rollout", spec=SPEC.to_dict())
        with pytest.raises(AirflowException, match="rollout timeout"):
            op.execute_complete({}, got[0])
        kube.delete(("apps/v1", "Deployment", "default", SPEC.name))


def test_a_delete_with_nothing_left_is_done_at_once(gke_lc: RunningLocalCloud, gke_conn: str) -> None:
    got = events(DeletedTrigger(**kwargs(gke_lc, gke_conn, 30)))
    assert got == [{"status": "done", "reason": "nothing left", "left": []}]


def test_an_unknown_cluster_is_one_error_event(gke_lc: RunningLocalCloud, gke_conn: str) -> None:
    got = events(RolloutTrigger(**kwargs(gke_lc, gke_conn, 30, cluster="no-such-cluster")))
    assert [e["status"] for e in got] == ["error"], got
    assert "no-such-cluster" in got[0]["message"] or "NotFound" in got[0]["message"], got
