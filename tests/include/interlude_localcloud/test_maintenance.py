"""Maintenance and preemption, observed as a Google Cloud user would, plus the machine's own process.

TPU: scheduled notice via v2alpha1 simulateMaintenanceEvent (googleapiclient + the shipped discovery
doc), upcomingMaintenance read from raw REST (tpu_v2 drops it), performMaintenance, unscheduled
maintenance, spot preemption. GCE: the same through compute_v1.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2
from googleapiclient.discovery import build

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import (
    ZONE,
    Compute,
    fast_scenario,
    gpu_instance,
    metadata_gets_in_flight,
)

SCRIPT = "trap 'echo term >> boots.txt; exit 0' TERM\necho boot >> boots.txt\nwhile true; do sleep 0.1; done\n"


def until(pred: Callable[[], Any], timeout: float = 10.0, what: str = "") -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.03)
    raise AssertionError(f"timed out waiting for {what or pred}")


def boots_file(lc: RunningLocalCloud, kind: str, name: str) -> Path:
    return Path(lc.admin.machine(kind, ZONE, name)["disk_dir"]) / "boots.txt"


def lines(p: Path) -> list[str]:
    return p.read_text().split() if p.exists() else []


def raw_node(lc: RunningLocalCloud, name: str) -> dict[str, Any]:
    """What a user sees over plain REST (enum names, upcomingMaintenance included)."""
    return requests.get(f"{lc.api_endpoint}/v2/projects/{lc.project}/locations/{ZONE}/nodes/{name}", timeout=5).json()


def metadata(lc: RunningLocalCloud, kind: str, name: str, key: str) -> requests.Response:
    url = f"{lc.api_endpoint}/_machines/{kind}-{ZONE}-{name}/computeMetadata/v1/{key}"
    return requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=10)


def make_node(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient, name: str, spot: bool = False) -> None:
    node = tpu_v2.Node(
        accelerator_type="v6e-8",
        runtime_version="v2-alpha-tpuv6e",
        metadata={"startup-script": SCRIPT},
        scheduling_config=tpu_v2.SchedulingConfig(spot=spot),
    )
    tpu.create_node(parent=f"projects/{lc.project}/locations/{ZONE}", node_id=name, node=node).result(timeout=10)
    until(lambda: lines(boots_file(lc, "tpu", name)) == ["boot"], what="first boot")


def v2alpha1(lc: RunningLocalCloud) -> Any:
    return build(
        "tpu",
        "v2alpha1",
        credentials=AnonymousCredentials(),
        static_discovery=True,
        client_options={"api_endpoint": lc.api_endpoint},
    )


def test_tpu_scheduled_maintenance_cycle(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    make_node(lc, tpu, "m1")
    name = f"projects/{lc.project}/locations/{ZONE}/nodes/m1"
    api = v2alpha1(lc)
    op = api.projects().locations().nodes().simulateMaintenanceEvent(name=name, body={"workerIds": ["0"]}).execute()
    assert op["done"] is True
    n = raw_node(lc, "m1")
    up = n["upcomingMaintenance"]
    assert up["maintenanceStatus"] == "PENDING" and up["type"] == "SCHEDULED" and up["canReschedule"]
    assert up["windowStartTime"] <= up["latestWindowStartTime"] <= up["windowEndTime"]  # Google's order
    assert n["state"] == "READY"
    alpha = api.projects().locations().nodes().get(name=name).execute()
    assert alpha["upcomingMaintenance"]["maintenanceStatus"] == "PENDING"
    assert metadata(lc, "tpu", "m1", "instance/maintenance-event").text == "TERMINATE_ON_HOST_MAINTENANCE"
    assert metadata(lc, "tpu", "m1", "instance/upcoming-maintenance").json()["maintenance_status"] == "PENDING"
    # 7200 s notice / 3600 = 2 s later the window opens: node down, process terminated.
    down = until(lambda: (d := raw_node(lc, "m1")).get("health") == "UNHEALTHY_MAINTENANCE" and d, what="down")
    assert down["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING"
    assert down["upcomingMaintenance"]["canReschedule"] is False  # under way: it cannot move
    until(lambda: lines(boots_file(lc, "tpu", "m1")) == ["boot", "term"], what="SIGTERM reached the script")
    # Back after the restart duration: healthy, field cleared, startup script ran again.
    until(lambda: raw_node(lc, "m1").get("health") == "HEALTHY", what="healthy again")
    assert "upcomingMaintenance" not in raw_node(lc, "m1")
    assert tpu.get_node(name=name).state == tpu_v2.Node.State.READY
    until(lambda: lines(boots_file(lc, "tpu", "m1")) == ["boot", "term", "boot"], what="reboot")
    assert metadata(lc, "tpu", "m1", "instance/maintenance-event").text == "NONE"
    events = [e["event"] for e in lc.admin.events() if e.get("machine") == "tpu-us-central1-a-m1"]
    assert events.index("maintenance_notice") < events.index("maintenance_start") < events.index("maintenance_end")


def test_tpu_perform_maintenance_unscheduled_and_preemption(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    make_node(lc, tpu, "m2", spot=True)
    name = f"projects/{lc.project}/locations/{ZONE}/nodes/m2"
    api = v2alpha1(lc)
    lc.admin.next_maintenance("SCHEDULED", notice_seconds=10 * 86400, kind="tpu")
    api.projects().locations().nodes().simulateMaintenanceEvent(name=name, body={}).execute()
    assert raw_node(lc, "m2")["upcomingMaintenance"]["maintenanceStatus"] == "PENDING"
    api.projects().locations().nodes().performMaintenance(name=name, body={}).execute()
    n = raw_node(lc, "m2")
    assert n["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING" and n["health"] == "UNHEALTHY_MAINTENANCE"
    until(lambda: raw_node(lc, "m2").get("health") == "HEALTHY", what="back")
    until(lambda: lines(boots_file(lc, "tpu", "m2")).count("boot") == 2, what="second boot")
    # Unscheduled (Google-initiated), short notice.
    lc.admin.maintenance("tpu", ZONE, "m2")
    up = raw_node(lc, "m2")["upcomingMaintenance"]
    assert up["type"] == "UNSCHEDULED" and up["canReschedule"] is False
    until(lambda: raw_node(lc, "m2").get("health") == "UNHEALTHY_MAINTENANCE", what="unscheduled down")
    until(lambda: raw_node(lc, "m2").get("health") == "HEALTHY", what="unscheduled back")
    until(lambda: lines(boots_file(lc, "tpu", "m2")).count("boot") == 3, what="third boot")
    # Spot preemption: no notice, PREEMPTED, process gone for good.
    lc.admin.preempt("tpu", ZONE, "m2")
    assert tpu.get_node(name=name).state == tpu_v2.Node.State.PREEMPTED
    until(lambda: lc.admin.machine("tpu", ZONE, "m2")["pid"] is None, what="process stopped")
    until(lambda: lines(boots_file(lc, "tpu", "m2"))[-1] == "term", what="term")
    assert metadata(lc, "tpu", "m2", "instance/preempted").text == "TRUE"


def test_crash_restarts_the_process(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    make_node(lc, tpu, "c1")
    pid = lc.admin.machine("tpu", ZONE, "c1")["pid"]
    lc.admin.crash("tpu", ZONE, "c1")
    until(lambda: lines(boots_file(lc, "tpu", "c1")) == ["boot", "boot"], what="reboot after crash")
    assert lc.admin.machine("tpu", ZONE, "c1")["pid"] not in (None, pid)
    assert raw_node(lc, "c1")["state"] == "READY"


def test_metadata_wait_for_change(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    make_node(lc, tpu, "w1")
    first = metadata(lc, "tpu", "w1", "instance/maintenance-event")
    assert first.text == "NONE" and first.headers["ETag"]
    assert metadata(lc, "tpu", "w1", "project/project-id").text == lc.project
    assert "startup-script" in metadata(lc, "tpu", "w1", "instance/attributes/").text
    assert (
        requests.get(
            f"{lc.api_endpoint}/_machines/tpu-{ZONE}-w1/computeMetadata/v1/instance/name", timeout=5
        ).status_code
        == 403
    )
    lc.admin.next_maintenance("UNSCHEDULED", notice_seconds=3600, kind="tpu")
    # The long-poll is in the server, unanswered, before the event is asked for; it answers with the event (a
    # long-poll that did not wait would answer NONE at once, one that missed the change would time out with NONE).
    answers: list[requests.Response] = []
    key = f"instance/maintenance-event?wait_for_change=true&timeout_sec=10&last_etag={first.headers['ETag']}"
    poll = threading.Thread(target=lambda: answers.append(metadata(lc, "tpu", "w1", key)), daemon=True)
    poll.start()
    deadline = time.monotonic() + 30
    while metadata_gets_in_flight() == 0:
        assert poll.is_alive(), f"the long-poll was answered before the maintenance: {[a.text for a in answers]}"
        assert time.monotonic() < deadline, "the long-poll never reached the metadata server"
        time.sleep(0.02)
    waiting_when_asked = poll.is_alive() and not answers
    (
        v2alpha1(lc)
        .projects()
        .locations()
        .nodes()
        .simulateMaintenanceEvent(name=f"projects/{lc.project}/locations/{ZONE}/nodes/w1", body={})
        .execute()
    )
    poll.join(timeout=30)
    assert waiting_when_asked, answers
    assert [a.text for a in answers] == ["TERMINATE_ON_HOST_MAINTENANCE"], answers
    assert answers[0].headers["ETag"] != first.headers["ETag"]


def watch_statuses(compute: Compute, name: str, until_status: str, timeout: float = 15.0) -> list[str]:
    """The distinct statuses a poller sees, in order, until `until_status`."""
    seen: list[str] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = compute.get(name).status
        if not seen or seen[-1] != status:
            seen.append(status)
        if status == until_status:
            return seen
        time.sleep(0.02)
    raise AssertionError(f"{name} never reached {until_status}; saw {seen}")


@pytest.fixture(scope="module")
def slow_gce() -> Iterator[tuple[RunningLocalCloud, Compute]]:
    """Compute transitions long enough (0.5-1 s) for a poller to see every status on a loaded machine."""
    from interlude_localcloud.testing import running_localcloud

    sc = fast_scenario(delays={"gce_create": 3600, "gce_start": 1800, "gce_stop": 1800, "gce_delete": 180})
    with running_localcloud(sc, gcs=False, strict=True) as cloud:
        yield cloud, Compute(cloud.api_endpoint, cloud.project)


def test_gpu_drill_without_extended_notifications_has_no_notice(slow_gce: tuple[RunningLocalCloud, Compute]) -> None:
    """Google: simulating on a VM that cannot live-migrate terminates (and restarts) it with no notice,
    through STOPPING -> TERMINATED -> STAGING -> RUNNING."""
    lc, compute = slow_gce
    compute.wait(
        compute.instances.insert(
            project=lc.project,
            zone=ZONE,
            instance_resource=gpu_instance("drill1", script=SCRIPT, automatic_restart=True),
        )
    )
    until(lambda: lines(boots_file(lc, "gce", "drill1")) == ["boot"], what="first boot")
    compute.instances.simulate_maintenance_event(project=lc.project, zone=ZONE, instance="drill1")
    assert watch_statuses(compute, "drill1", "RUNNING") == ["STOPPING", "TERMINATED", "STAGING", "RUNNING"]
    until(lambda: lines(boots_file(lc, "gce", "drill1")) == ["boot", "term", "boot"], what="restarted")
    events = [e["event"] for e in lc.admin.events() if e.get("machine") == f"gce-{ZONE}-drill1"]
    assert "maintenance_notice" not in events and "maintenance_start" in events
    # No automaticRestart: terminated and stays so.
    compute.wait(
        compute.instances.insert(
            project=lc.project,
            zone=ZONE,
            instance_resource=gpu_instance("drill2", script=SCRIPT, automatic_restart=False),
        )
    )
    compute.instances.simulate_maintenance_event(project=lc.project, zone=ZONE, instance="drill2")
    until(lambda: not lc.admin.machine("gce", ZONE, "drill2")["holds_capacity"], what="released")
    assert compute.get("drill2").status == "TERMINATED"


def test_compute_insert_passes_staging(slow_gce: tuple[RunningLocalCloud, Compute]) -> None:
    lc, compute = slow_gce
    op = compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=gpu_instance("st1"))
    assert watch_statuses(compute, "st1", "RUNNING") == ["PROVISIONING", "STAGING", "RUNNING"]
    compute.wait(op)


@pytest.mark.parametrize(
    ("kind", "accelerator", "mtype", "can"),
    [
        ("tpu", "v6e-8", "SCHEDULED", True),  # 2x4: manual start allowed
        ("tpu", "v6e-4", "SCHEDULED", False),  # smaller v5e/v6e slices: not
        ("tpu", "v5litepod-4", "SCHEDULED", False),
        ("tpu", "v5litepod-16", "SCHEDULED", True),
        ("tpu", "v5p-8", "SCHEDULED", True),  # any v4/v5p
        ("tpu", "v4-8", "SCHEDULED", True),
        ("tpu", "v6e-8", "UNSCHEDULED", False),  # critical maintenance cannot move
        ("gce", "", "SCHEDULED", True),
        ("gce", "", "UNSCHEDULED", False),
    ],
)
def test_can_reschedule_only_where_google_allows_manual_start(
    tmp_path: Path, kind: str, accelerator: str, mtype: str, can: bool
) -> None:
    """https://cloud.google.com/tpu/docs/manually-start-maintenance: any v4/v5p, v5e/v6e from 2x4."""
    from interlude_localcloud.cloud import Cloud, Machine

    cloud = Cloud(fast_scenario(), tmp_path)
    m = Machine(kind, ZONE, "x", {"acceleratorType": accelerator}, False, "", 0, proc=None)  # type: ignore[arg-type]
    assert cloud.can_start_early(m, mtype) is can


def test_gpu_vm_maintenance_cycle_and_spot_preemption(lc: RunningLocalCloud, compute: Compute) -> None:
    compute.wait(
        compute.instances.insert(
            project=lc.project, zone=ZONE, instance_resource=gpu_instance("vm1", script=SCRIPT, automatic_restart=True)
        )
    )
    until(lambda: lines(boots_file(lc, "gce", "vm1")) == ["boot"], what="first boot")
    compute.instances.simulate_maintenance_event(
        request={"project": lc.project, "zone": ZONE, "instance": "vm1", "with_extended_notifications": True}
    )
    up = compute.get("vm1").resource_status.upcoming_maintenance
    assert up.maintenance_status == "PENDING" and up.type_ == "SCHEDULED"
    assert metadata(lc, "gce", "vm1", "instance/upcoming-maintenance?alt=json").json()["type"] == "SCHEDULED"
    # GPU VM: 3600 s notice -> 1 s; then TERMINATED while the host is serviced, RUNNING again (automaticRestart).
    until(lambda: compute.get("vm1").status in ("STOPPING", "TERMINATED"), what="down for maintenance")
    assert compute.get("vm1").resource_status.upcoming_maintenance.can_reschedule is False  # ONGOING
    until(lambda: compute.get("vm1").status == "RUNNING", what="running again")
    assert "upcoming_maintenance" not in compute.get("vm1").resource_status
    until(lambda: lines(boots_file(lc, "gce", "vm1")) == ["boot", "term", "boot"], what="reboot")
    # performMaintenance starts a pending maintenance at once.
    lc.admin.next_maintenance("SCHEDULED", notice_seconds=86400, kind="gce")
    compute.instances.simulate_maintenance_event(
        request={"project": lc.project, "zone": ZONE, "instance": "vm1", "with_extended_notifications": True}
    )
    assert compute.get("vm1").resource_status.upcoming_maintenance.can_reschedule is True
    compute.instances.perform_maintenance(project=lc.project, zone=ZONE, instance="vm1")
    assert compute.get("vm1").status in ("STOPPING", "TERMINATED")
    assert compute.get("vm1").resource_status.upcoming_maintenance.can_reschedule is False
    until(lambda: compute.get("vm1").status == "RUNNING", what="running after performMaintenance")
    # Unscheduled maintenance through the admin endpoint.
    lc.admin.maintenance("gce", ZONE, "vm1")
    assert compute.get("vm1").resource_status.upcoming_maintenance.type_ == "UNSCHEDULED"
    until(lambda: compute.get("vm1").status == "TERMINATED", what="unscheduled down")
    until(lambda: compute.get("vm1").status == "RUNNING", what="unscheduled back")
    # Spot VM preempted: TERMINATED, preempted TRUE, process gone, capacity released.
    compute.wait(
        compute.instances.insert(
            project=lc.project, zone=ZONE, instance_resource=gpu_instance("spot1", spot=True, script=SCRIPT)
        )
    )
    until(lambda: lines(boots_file(lc, "gce", "spot1")) == ["boot"], what="spot boot")
    lc.admin.preempt("gce", ZONE, "spot1")
    assert compute.get("spot1").status == "TERMINATED"
    assert metadata(lc, "gce", "spot1", "instance/preempted").text == "TRUE"
    until(lambda: lines(boots_file(lc, "gce", "spot1")) == ["boot", "term"], what="spot term")
    assert not lc.admin.machine("gce", ZONE, "spot1")["holds_capacity"]


def test_perform_maintenance_refuses_what_cannot_be_rescheduled(
    lc: RunningLocalCloud, tpu: tpu_v2.TpuClient, compute: Compute
) -> None:
    """Google starts a maintenance early only when canReschedule is true and it is PENDING
    (https://cloud.google.com/tpu/docs/manually-start-maintenance); an UNSCHEDULED one cannot move."""
    from googleapiclient.errors import HttpError

    make_node(lc, tpu, "nr1")
    lc.admin.maintenance("tpu", ZONE, "nr1", type="UNSCHEDULED", notice_seconds=10 * 86400)
    up = raw_node(lc, "nr1")["upcomingMaintenance"]
    assert up["maintenanceStatus"] == "PENDING" and up["canReschedule"] is False
    name = f"projects/{lc.project}/locations/{ZONE}/nodes/nr1"
    with pytest.raises(HttpError) as refused:
        v2alpha1(lc).projects().locations().nodes().performMaintenance(name=name, body={}).execute()
    assert refused.value.resp.status == 400
    assert raw_node(lc, "nr1")["upcomingMaintenance"]["maintenanceStatus"] == "PENDING"  # still where it was

    compute.wait(
        compute.instances.insert(
            project=lc.project, zone=ZONE, instance_resource=gpu_instance("vr1", script=SCRIPT, automatic_restart=True)
        )
    )
    lc.admin.maintenance("gce", ZONE, "vr1", type="UNSCHEDULED", notice_seconds=86400)
    assert compute.get("vr1").resource_status.upcoming_maintenance.can_reschedule is False
    with pytest.raises(Exception, match="cannot be rescheduled"):
        compute.instances.perform_maintenance(project=lc.project, zone=ZONE, instance="vr1")
    assert compute.get("vr1").status == "RUNNING"
