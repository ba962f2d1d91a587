"""TpuHook / AsyncTpuHook against the real local cloud, through the real google-cloud-tpu client.

Each test cleans up the nodes it made, so capacity and quota start from zero for the next one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from interlude.hooks._retry import RetryPolicy
from interlude.hooks.errors import InvalidRequestError, QuotaExceededError, StockoutError, TransientError
from interlude.hooks.tpu import AsyncTpuHook, TpuHook

ZONE = "us-east5-b"
FAST_RETRY = RetryPolicy(max_attempts=6, initial_delay=0.02, max_delay=0.1)
V6E = {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e", "labels": {"run": "hooks-test"}}
V5E = {"acceleratorType": "v5litepod-8", "runtimeVersion": "v2-alpha-tpuv5-lite"}


def make_hook(lc: Any, **kwargs: Any) -> TpuHook:
    return TpuHook(
        None,
        tpu_endpoint=lc.api_endpoint,
        project_id=lc.project,
        retry_policy=FAST_RETRY,
        poll_interval=0.1,
        operation_timeout=30,
        **kwargs,
    )


def make_async_hook(lc: Any) -> AsyncTpuHook:
    return AsyncTpuHook(
        None, tpu_endpoint=lc.api_endpoint, project_id=lc.project, retry_policy=FAST_RETRY, poll_interval=0.1
    )


@pytest.fixture
def hook(localcloud: Any) -> Iterator[TpuHook]:
    h = make_hook(localcloud)
    yield h
    for node in h.list_nodes(ZONE):
        h.delete_node(ZONE, node["name"].rsplit("/", 1)[-1])
    for qr in h.list_queued_resources(ZONE):
        h.delete_queued_resource(ZONE, qr["name"].rsplit("/", 1)[-1])
    assert h.list_nodes(ZONE) == []


def test_catalog(hook: TpuHook) -> None:
    assert hook.list_accelerator_types(ZONE) == ["v5litepod-8", "v6e-8"]
    assert hook.list_runtime_versions(ZONE) == ["v2-alpha-tpuv5-lite", "v2-alpha-tpuv6e"]


def test_node_lifecycle_idempotent_create_and_stockout(hook: TpuHook) -> None:
    node = hook.create_node(ZONE, "lifecycle-a", V6E)
    assert node["name"].endswith("/nodes/lifecycle-a")
    assert node["state"] == "READY" and node["health"] == "HEALTHY"  # enum NAMES, camelCase keys
    assert node["acceleratorType"] == "v6e-8" and node["labels"] == {"run": "hooks-test"}

    again = hook.create_node(ZONE, "lifecycle-a", V6E)  # a retried task creating the same node
    assert again["id"] == node["id"] and again["createTime"] == node["createTime"]

    assert hook.get_node(ZONE, "lifecycle-a") == again
    assert [n["name"] for n in hook.list_nodes(ZONE)] == [node["name"]]

    # The zone holds one v6e-8: the second create ends with Google's stockout operation error.
    with pytest.raises(StockoutError) as info:
        hook.create_node(ZONE, "lifecycle-b", V6E)
    assert "There is no more capacity in the zone" in info.value.message
    assert info.value.status == "RESOURCE_EXHAUSTED"
    assert hook.get_node(ZONE, "lifecycle-b") is None

    hook.delete_node(ZONE, "lifecycle-a")
    assert hook.get_node(ZONE, "lifecycle-a") is None
    hook.delete_node(ZONE, "lifecycle-a")  # deleting a missing node is fine

    # Capacity came back with the delete.
    assert hook.create_node(ZONE, "lifecycle-b", V6E)["state"] == "READY"


def test_create_without_wait_returns_the_creating_node(hook: TpuHook) -> None:
    node = hook.create_node(ZONE, "nowait", V6E, wait=False)
    assert node["state"] == "CREATING"
    settled = hook.create_node(ZONE, "nowait", V6E)  # idempotent create waits out CREATING
    assert settled["state"] == "READY" and settled["id"] == node["id"]


def test_quota_exceeded(hook: TpuHook) -> None:
    hook.create_node(ZONE, "quota-a", V5E)  # 8 chips: exactly the v5e quota
    with pytest.raises(QuotaExceededError) as info:
        hook.create_node(ZONE, "quota-b", V5E)
    assert info.value.message.startswith("Quota limit '")
    assert "has been exceeded" in info.value.message


def test_invalid_requests(hook: TpuHook) -> None:
    with pytest.raises(InvalidRequestError, match="not available"):
        hook.create_node(ZONE, "bad-type", {"acceleratorType": "v9-8", "runtimeVersion": "v2-alpha-tpuv6e"})
    with pytest.raises(InvalidRequestError, match="noSuchField"):
        hook.create_node(ZONE, "bad-field", {**V6E, "noSuchField": 1})


def test_stop_and_start(hook: TpuHook) -> None:
    hook.create_node(ZONE, "stopstart", V6E)
    assert hook.stop_node(ZONE, "stopstart")["state"] == "STOPPED"
    assert hook.start_node(ZONE, "stopstart")["state"] == "READY"


def test_maintenance_visible_to_sync_and_async_hooks(hook: TpuHook, localcloud: Any) -> None:
    hook.create_node(ZONE, "maint", V6E)
    assert "upcomingMaintenance" not in hook.get_node(ZONE, "maint")

    localcloud.admin.next_maintenance("SCHEDULED", notice_seconds=3600, kind="tpu")
    op = hook.simulate_maintenance_event(ZONE, "maint")
    assert op["name"].startswith(f"projects/{localcloud.project}/locations/{ZONE}/operations/")

    upcoming = hook.get_node(ZONE, "maint")["upcomingMaintenance"]
    assert upcoming["type"] == "SCHEDULED" and upcoming["maintenanceStatus"] == "PENDING"
    assert upcoming["canReschedule"] is True and upcoming["windowStartTime"].endswith("Z")

    async def read_async() -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
        async with make_async_hook(localcloud) as ahook:
            return (
                await ahook.get_node(ZONE, "maint"),
                await ahook.list_nodes(ZONE),
                await ahook.get_node(ZONE, "no-such-node"),
            )

    anode, alist, missing = asyncio.run(read_async())
    assert anode is not None and anode["upcomingMaintenance"] == upcoming
    assert [n["upcomingMaintenance"] for n in alist] == [upcoming]
    assert missing is None

    # Starting the pending maintenance early takes the node down for maintenance, then back.
    hook.perform_maintenance(ZONE, "maint")
    down = hook.get_node(ZONE, "maint")
    assert down["state"] == "REPAIRING" and down["health"] == "UNHEALTHY_MAINTENANCE"
    assert down["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING"
    deadline = time.monotonic() + 10
    while hook.get_node(ZONE, "maint")["state"] != "READY":
        assert time.monotonic() < deadline, "the node never came back READY after its maintenance"
        time.sleep(0.1)
    assert "upcomingMaintenance" not in hook.get_node(ZONE, "maint")


def test_503_burst_is_survived_then_a_longer_one_gives_up(hook: TpuHook, localcloud: Any) -> None:
    since = time.time()
    localcloud.admin.inject_fault("/nodes", status=503, count=4)
    node = hook.create_node(ZONE, "bursty", V6E)  # the create POST itself gets 503s first
    assert node["state"] == "READY"
    localcloud.admin.inject_fault("/nodes", status=429, count=3)
    assert len(hook.list_nodes(ZONE)) == 1

    async def list_async() -> list[dict[str, Any]]:
        async with make_async_hook(localcloud) as ahook:
            return await ahook.list_nodes(ZONE)

    localcloud.admin.inject_fault("/nodes", status=503, count=5)
    assert [n["name"] for n in asyncio.run(list_async())] == [node["name"]]

    injected = [e for e in localcloud.admin.events(since) if e["event"] == "fault_injected"]
    assert len(injected) == 12

    localcloud.admin.inject_fault("/nodes", status=503, count=FAST_RETRY.max_attempts)
    with pytest.raises(TransientError) as info:
        hook.get_node(ZONE, "bursty")
    assert info.value.code == 503 and "currently unavailable" in info.value.message


def test_queued_resource(hook: TpuHook) -> None:
    # On the shared strict cloud: QueuedResource answers echo tpu.nodeSpec[].node as the template sent.
    body = {
        "tpu": {"nodeSpec": [{"parent": hook.parent(ZONE), "nodeId": "qr-node", "node": V6E}]},
        "spot": {},
    }
    qr = hook.create_queued_resource(ZONE, "qr-1", body)
    assert qr["name"].endswith("/queuedResources/qr-1") and "state" in qr["state"]
    assert hook.create_queued_resource(ZONE, "qr-1", body)["createTime"] == qr["createTime"]
    deadline = time.monotonic() + 10
    while (hook.get_queued_resource(ZONE, "qr-1") or {})["state"]["state"] != "ACTIVE":
        assert time.monotonic() < deadline, "the queued resource never became ACTIVE"
        time.sleep(0.1)
    assert hook.get_node(ZONE, "qr-node")["state"] == "READY"
    assert [q["name"] for q in hook.list_queued_resources(ZONE)] == [qr["name"]]
    hook.delete_queued_resource(ZONE, "qr-1", force=True)
    assert hook.get_queued_resource(ZONE, "qr-1") is None
    assert hook.get_node(ZONE, "qr-node") is None
    hook.delete_queued_resource(ZONE, "qr-1")  # missing is fine


def test_endpoint_and_project_come_from_the_airflow_connection(
    localcloud: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = {"is_anonymous": True, "project": localcloud.project, "tpu_endpoint": localcloud.api_endpoint}
    conn = {"conn_type": "google_cloud_platform", "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_INTERLUDE_HOOKS_TEST", json.dumps(conn))
    hook = TpuHook("interlude_hooks_test", retry_policy=FAST_RETRY)
    assert hook.project == localcloud.project and hook.base_url == localcloud.api_endpoint
    assert hook.list_accelerator_types(ZONE) == ["v5litepod-8", "v6e-8"]

    async def via_async() -> list[dict[str, Any]]:
        async with AsyncTpuHook("interlude_hooks_test") as ahook:
            return await ahook.list_nodes(ZONE)

    assert asyncio.run(via_async()) == []


def test_bearer_token_never_reaches_the_logs_or_errors(localcloud: Any, caplog: pytest.LogCaptureFixture) -> None:
    from google.oauth2.credentials import Credentials

    secret = "ya29.secret-token-for-the-log-test"
    hook = make_hook(localcloud)
    hook._cached_credentials = Credentials(token=secret)  # what a real connection would load
    caplog.set_level(logging.DEBUG)
    localcloud.admin.inject_fault("/nodes", status=503, count=FAST_RETRY.max_attempts)
    with pytest.raises(TransientError) as info:
        hook.list_nodes(ZONE)
    assert hook.get_node(ZONE, "absent") is None
    assert hook.list_accelerator_types(ZONE)
    assert "transient error" in caplog.text
    assert secret not in caplog.text and secret not in repr(info.value) and secret not in str(info.value.details)
