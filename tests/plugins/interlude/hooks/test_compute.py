"""ComputeHook / AsyncComputeHook against the real local cloud, over Compute Engine's REST API.

Each test deletes the VMs it made, so zone capacity and regional quota start from zero for the next.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from interlude.hooks._retry import RetryPolicy
from interlude.hooks.compute import AsyncComputeHook, ComputeHook
from interlude.hooks.errors import InvalidRequestError, QuotaExceededError, StockoutError, TransientError

ZONE = "us-central1-a"
REGION = "us-central1"
FAST_RETRY = RetryPolicy(max_attempts=6, initial_delay=0.02, max_delay=0.1)


def l4_vm(name: str) -> dict[str, Any]:
    """A one-L4 GPU VM as a user would write it (Google's JSON: camelCase, enum names)."""
    return {
        "name": name,
        "machineType": f"zones/{ZONE}/machineTypes/g2-standard-8",
        "scheduling": {"onHostMaintenance": "TERMINATE", "automaticRestart": True},
        "labels": {"run": "hooks-test"},
        "metadata": {"items": [{"key": "interlude-stage", "value": "train"}]},
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {"sourceImage": "projects/debian-cloud/global/images/family/debian-12"},
            }
        ],
        "networkInterfaces": [{"network": "global/networks/default"}],
    }


def t4_vm(name: str) -> dict[str, Any]:
    body = l4_vm(name)
    body["machineType"] = f"zones/{ZONE}/machineTypes/n1-standard-8"
    body["guestAccelerators"] = [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", "acceleratorCount": 1}
    ]
    return body


def make_async_hook(lc: Any) -> AsyncComputeHook:
    return AsyncComputeHook(None, compute_endpoint=lc.api_endpoint, project_id=lc.project, retry_policy=FAST_RETRY)


@pytest.fixture
def hook(localcloud: Any) -> Iterator[ComputeHook]:
    h = ComputeHook(
        None,
        compute_endpoint=localcloud.api_endpoint,
        project_id=localcloud.project,
        retry_policy=FAST_RETRY,
        poll_interval=0.1,
        operation_timeout=30,
    )
    yield h
    for inst in h.list_instances(ZONE):
        h.delete_instance(ZONE, inst["name"])
    assert h.list_instances(ZONE) == []


def test_catalog_quotas_and_reservations(hook: ComputeHook) -> None:
    assert hook.list_accelerator_types(ZONE) == ["nvidia-l4", "nvidia-tesla-t4"]
    assert hook.list_machine_types(ZONE) == ["g2-standard-24", "g2-standard-8", "n1-standard-8"]
    quotas = hook.get_region_quotas(REGION)
    assert quotas["NVIDIA_L4_GPUS"] == (8.0, 0.0) and quotas["NVIDIA_T4_GPUS"] == (1.0, 0.0)
    [res] = hook.list_reservations(ZONE)
    assert res["name"] == "l4-res" and res["specificReservation"]["count"] == "2"
    assert res["specificReservation"]["inUseCount"] == "1"
    props = res["specificReservation"]["instanceProperties"]
    assert props["guestAccelerators"] == [{"acceleratorType": "nvidia-l4", "acceleratorCount": 1}]


def test_instance_lifecycle_idempotent_insert_and_stockout(hook: ComputeHook) -> None:
    vm = hook.insert_instance(ZONE, l4_vm("gpu-a"))
    assert vm["status"] == "RUNNING" and vm["name"] == "gpu-a"
    assert vm["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert vm["metadata"]["items"] == [{"key": "interlude-stage", "value": "train"}]

    again = hook.insert_instance(ZONE, l4_vm("gpu-a"))  # a retried task inserting the same VM
    assert again["id"] == vm["id"] and again["creationTimestamp"] == vm["creationTimestamp"]
    assert hook.get_instance(ZONE, "gpu-a") == again
    assert [i["name"] for i in hook.list_instances(ZONE, filter="labels.run = hooks-test")] == ["gpu-a"]
    assert hook.list_instances(ZONE, filter="labels.run = other") == []
    assert hook.get_region_quotas(REGION)["NVIDIA_L4_GPUS"] == (8.0, 1.0)

    # The zone holds one L4: the next insert's operation ends ZONE_RESOURCE_POOL_EXHAUSTED.
    with pytest.raises(StockoutError) as info:
        hook.insert_instance(ZONE, l4_vm("gpu-b"))
    assert info.value.status == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert "does not have enough resources available" in info.value.message
    assert hook.get_instance(ZONE, "gpu-b") is None

    hook.delete_instance(ZONE, "gpu-a")
    assert hook.get_instance(ZONE, "gpu-a") is None
    hook.delete_instance(ZONE, "gpu-a")  # deleting a missing VM is fine
    assert hook.insert_instance(ZONE, l4_vm("gpu-b"))["status"] == "RUNNING"


def test_quota_exceeded_at_insert_time(hook: ComputeHook) -> None:
    assert hook.insert_instance(ZONE, t4_vm("t4-a"))["status"] == "RUNNING"
    with pytest.raises(QuotaExceededError) as info:
        hook.insert_instance(ZONE, t4_vm("t4-b"))
    assert info.value.code == 403 and info.value.message.startswith("Quota 'NVIDIA_T4_GPUS' exceeded.")


def test_invalid_requests(hook: ComputeHook) -> None:
    body = l4_vm("bad-type")
    body["machineType"] = f"zones/{ZONE}/machineTypes/a9-megagpu-99g"
    with pytest.raises(InvalidRequestError, match="does not exist"):
        hook.insert_instance(ZONE, body)
    with pytest.raises(InvalidRequestError, match="noSuchField"):
        hook.insert_instance(ZONE, {**l4_vm("bad-field"), "noSuchField": 1})
    with pytest.raises(InvalidRequestError, match="name"):
        hook.insert_instance(ZONE, {"machineType": "g2-standard-8"})


def test_stop_and_start(hook: ComputeHook) -> None:
    hook.insert_instance(ZONE, l4_vm("stopstart"))
    hook.stop_instance(ZONE, "stopstart")
    assert hook.get_instance(ZONE, "stopstart")["status"] == "TERMINATED"
    hook.start_instance(ZONE, "stopstart")
    assert hook.get_instance(ZONE, "stopstart")["status"] == "RUNNING"


def test_maintenance_visible_to_sync_and_async_hooks(hook: ComputeHook, localcloud: Any) -> None:
    hook.insert_instance(ZONE, l4_vm("maint"))
    assert "upcomingMaintenance" not in (hook.get_instance(ZONE, "maint").get("resourceStatus") or {})

    localcloud.admin.next_maintenance("SCHEDULED", notice_seconds=3600, kind="gce")
    hook.simulate_maintenance_event(ZONE, "maint")
    upcoming = hook.get_instance(ZONE, "maint")["resourceStatus"]["upcomingMaintenance"]
    assert upcoming["type"] == "SCHEDULED" and upcoming["maintenanceStatus"] == "PENDING"
    assert upcoming["canReschedule"] is True

    async def read_async() -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
        async with make_async_hook(localcloud) as ahook:
            return (
                await ahook.get_instance(ZONE, "maint"),
                await ahook.list_instances(ZONE),
                await ahook.get_instance(ZONE, "no-such-vm"),
            )

    avm, alist, missing = asyncio.run(read_async())
    assert avm is not None and avm["resourceStatus"]["upcomingMaintenance"] == upcoming
    assert [i["resourceStatus"]["upcomingMaintenance"] for i in alist] == [upcoming]
    assert missing is None

    # Starting it early: the GPU VM terminates for maintenance, then restarts (automaticRestart).
    hook.perform_maintenance(ZONE, "maint")
    assert hook.get_instance(ZONE, "maint")["status"] in ("STOPPING", "TERMINATED")  # Google's path down
    deadline = time.monotonic() + 10
    while hook.get_instance(ZONE, "maint")["status"] != "RUNNING":
        assert time.monotonic() < deadline, "the VM never came back RUNNING after its maintenance"
        time.sleep(0.1)


def test_drill_without_extended_notifications_gets_no_notice(hook: ComputeHook, localcloud: Any) -> None:
    """The flag is what gives a drill its notice (Google's simulateMaintenanceEvent); without it the GPU VM
    goes down at once. The default drill sends it."""
    hook.insert_instance(ZONE, l4_vm("nonotice"))
    hook.simulate_maintenance_event(ZONE, "nonotice", with_extended_notifications=False)
    vm = hook.get_instance(ZONE, "nonotice")
    assert vm["status"] in ("STOPPING", "TERMINATED")
    assert vm["resourceStatus"]["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING"
    events = [e["event"] for e in localcloud.admin.events() if e.get("machine") == f"gce-{ZONE}-nonotice"]
    assert "maintenance_notice" not in events


def test_503_burst_is_survived_then_a_longer_one_gives_up(hook: ComputeHook, localcloud: Any) -> None:
    since = time.time()
    localcloud.admin.inject_fault("/instances", status=503, count=4)  # insert POST, then the reads
    localcloud.admin.inject_fault("/operations/", status=503, count=3)  # our own operation polling
    assert hook.insert_instance(ZONE, l4_vm("bursty"))["status"] == "RUNNING"

    async def list_async() -> list[dict[str, Any]]:
        async with make_async_hook(localcloud) as ahook:
            return await ahook.list_instances(ZONE)

    localcloud.admin.inject_fault("/instances", status=429, count=5)
    assert [i["name"] for i in asyncio.run(list_async())] == ["bursty"]
    injected = [e for e in localcloud.admin.events(since) if e["event"] == "fault_injected"]
    assert len(injected) == 12

    localcloud.admin.inject_fault("/instances", status=503, count=FAST_RETRY.max_attempts)
    with pytest.raises(TransientError):
        hook.get_instance(ZONE, "bursty")


def test_endpoint_and_project_come_from_the_airflow_connection(
    localcloud: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = {"is_anonymous": True, "project": localcloud.project, "compute_endpoint": localcloud.api_endpoint}
    monkeypatch.setenv(
        "AIRFLOW_CONN_INTERLUDE_HOOKS_TEST", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
    hook = ComputeHook("interlude_hooks_test", retry_policy=FAST_RETRY)
    assert hook.list_accelerator_types(ZONE) == ["nvidia-l4", "nvidia-tesla-t4"]

    async def via_async() -> list[dict[str, Any]]:
        async with AsyncComputeHook("interlude_hooks_test") as ahook:
            return await ahook.list_instances(ZONE)

    assert asyncio.run(via_async()) == []


def test_time_scale_comes_from_the_connection(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local cloud's dev env tells Airflow its clock; Google's connection (no extra) runs at 1."""
    from interlude_dev import wiring as dev

    cloud = dev.LocalCloud(
        process=None,
        api_endpoint="http://127.0.0.1:1",
        gcs_endpoint="http://127.0.0.1:2",  # type: ignore[arg-type]
        project="p",
        state_dir=tmp_path,
        time_scale=600.0,
    )
    monkeypatch.setenv("AIRFLOW_CONN_SCALED", dev.airflow_env(tmp_path, cloud)["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    assert ComputeHook("scaled").time_scale == 600.0
    google = {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": "p"}}
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE", json.dumps(google))
    assert ComputeHook("google").time_scale == 1.0
    google["extra"]["time_scale"] = 0  # type: ignore[index]
    monkeypatch.setenv("AIRFLOW_CONN_BROKEN", json.dumps(google))
    with pytest.raises(ValueError, match="time_scale must be > 0"):
        ComputeHook("broken").time_scale  # noqa: B018


GPU_PATH = """
import json, sys
from interlude.hooks.compute import ComputeHook
hook = ComputeHook(None, compute_endpoint=sys.argv[1], project_id=sys.argv[2], poll_interval=0.1)
body = json.loads(sys.argv[3])
facts = [hook.list_accelerator_types("us-central1-a"), "NVIDIA_L4_GPUS" in hook.get_region_quotas("us-central1")]
facts.append(hook.insert_instance("us-central1-a", body)["status"])
hook.delete_instance("us-central1-a", body["name"])
print(json.dumps({"facts": facts, "compute_v1": "google.cloud.compute_v1" in sys.modules}))
"""


def test_a_gpu_vm_lifecycle_never_imports_the_compute_client_library(localcloud: Any) -> None:
    """The hook is raw REST: a process that probes GPU capacity and creates and deletes a VM never loads
    google.cloud.compute_v1 (~1.2-1.6 CPU-s and ~93 MB per process, paid by every task and `dags test`)."""
    out = subprocess.run(
        [sys.executable, "-c", GPU_PATH, localcloud.api_endpoint, localcloud.project, json.dumps(l4_vm("no-lib"))],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["facts"] == [["nvidia-l4", "nvidia-tesla-t4"], True, "RUNNING"]
    assert result["compute_v1"] is False
    assert localcloud.admin.machine("gce", ZONE, "no-lib") is None  # the cloud's own list: deleted
