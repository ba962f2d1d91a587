"""A whole lifecycle (create, maintenance, delete) on each API, every answer checked by strict mode.

Strict mode validates each successful answer against Google's discovery document (tpu.v2.json,
tpu.v2alpha1.json, compute.v1.json), including the Node/QueuedResource packed into an operation's
`response`. These walks touch every method a pipeline uses, through the client a pipeline uses, and
end with `violations == []`: the local cloud's answers are Google-shaped end to end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2
from googleapiclient.discovery import build

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import ZONE, Compute, gpu_instance

INT_ENUMS = {"$alt": "json;enum-encoding=int"}


def until(pred: Callable[[], Any], what: str, timeout: float = 15.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if got := pred():
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _strict_and_clean(lc: RunningLocalCloud) -> None:
    assert lc._lc.server is not None and lc._lc.server.strict
    assert lc.violations == []
    assert lc.admin.violations() == []


def test_tpu_v2_lifecycle_with_the_proto_rest_client(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    """tpu_v2 (enum numbers both ways): node create/stop/start/patch, Google-initiated maintenance,
    a queued resource to ACTIVE, deletes; plus plain REST reads in both enum encodings."""
    parent = f"projects/{lc.project}/locations/{ZONE}"
    name = f"{parent}/nodes/life"
    base = f"{lc.api_endpoint}/v2/{name}"
    assert {t.type_ for t in tpu.list_accelerator_types(parent=parent)} == {"v5litepod-8", "v6e-8"}
    assert tpu.get_runtime_version(name=f"{parent}/runtimeVersions/v2-alpha-tpuv6e").version
    node = tpu.create_node(
        parent=parent,
        node_id="life",
        node=tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e", labels={"run": "life"}),
    )
    node = node.result(timeout=10)
    assert node.state == tpu_v2.Node.State.READY and node.create_time
    assert tpu.stop_node(request={"name": name}).result(timeout=10).state == tpu_v2.Node.State.STOPPED
    assert tpu.start_node(request={"name": name}).result(timeout=10).state == tpu_v2.Node.State.READY
    patched = tpu.update_node(
        node=tpu_v2.Node(name=name, labels={"run": "life", "x": "y"}), update_mask={"paths": ["labels"]}
    ).result(timeout=10)
    assert patched.labels["x"] == "y"

    lc.admin.maintenance("tpu", ZONE, "life", type="UNSCHEDULED")  # 1800 s notice -> 0.5 s real
    for params in ({}, INT_ENUMS):
        pending = requests.get(base, params=params, timeout=5)
        assert pending.status_code == 200 and "upcomingMaintenance" in pending.json()
    until(lambda: tpu.get_node(name=name).state == tpu_v2.Node.State.REPAIRING, "REPAIRING")
    for params in ({}, INT_ENUMS):
        assert requests.get(base, params=params, timeout=5).status_code == 200
    assert [n.health for n in tpu.list_nodes(parent=parent)] == [tpu_v2.Node.Health.UNHEALTHY_MAINTENANCE]
    until(lambda: tpu.get_node(name=name).state == tpu_v2.Node.State.READY, "READY after maintenance")

    qr = tpu_v2.QueuedResource(
        spot=tpu_v2.QueuedResource.Spot(),
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[
                tpu_v2.QueuedResource.Tpu.NodeSpec(
                    parent=parent,
                    node_id="qnode",
                    node=tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e"),
                )
            ]
        ),
    )
    created = tpu.create_queued_resource(parent=parent, queued_resource_id="lq", queued_resource=qr)
    assert created.result(timeout=10).tpu.node_spec[0].node.accelerator_type == "v6e-8"
    qr_name = f"{parent}/queuedResources/lq"
    active = tpu_v2.QueuedResourceState.State.ACTIVE
    until(lambda: tpu.get_queued_resource(name=qr_name).state.state == active, "queued resource ACTIVE")
    assert [q.name for q in tpu.list_queued_resources(parent=parent)] == [qr_name]
    for params in ({}, INT_ENUMS):
        assert requests.get(f"{lc.api_endpoint}/v2/{qr_name}", params=params, timeout=5).status_code == 200
    tpu.delete_queued_resource(request={"name": qr_name, "force": True}).result(timeout=10)

    tpu.delete_node(name=name).result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=name)
    assert list(tpu.list_nodes(parent=parent)) == []
    ops = tpu.list_operations(request={"name": parent}).operations
    assert ops and all(tpu.get_operation(request={"name": o.name}).done for o in ops)
    _strict_and_clean(lc)


def test_tpu_v2alpha1_lifecycle_with_googleapiclient(lc: RunningLocalCloud) -> None:
    """v2alpha1 through the discovery client (enum names): simulate + perform maintenance, queued
    resource, delete."""
    api = build(
        "tpu",
        "v2alpha1",
        credentials=AnonymousCredentials(),
        static_discovery=True,
        client_options={"api_endpoint": lc.api_endpoint},
    )
    loc = api.projects().locations()
    parent = f"projects/{lc.project}/locations/{ZONE}"
    name = f"{parent}/nodes/alpha"

    def done(op: dict[str, Any]) -> dict[str, Any]:
        return until(
            lambda: (o := loc.operations().get(name=op["name"]).execute()).get("done") and o, f"operation {op['name']}"
        )

    assert loc.acceleratorTypes().list(parent=parent).execute()["acceleratorTypes"]
    assert loc.runtimeVersions().list(parent=parent).execute()["runtimeVersions"]
    op = (
        loc.nodes()
        .create(parent=parent, nodeId="alpha", body={"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e"})
        .execute()
    )
    assert done(op)["response"]["state"] == "READY"

    lc.admin.next_maintenance("SCHEDULED", notice_seconds=86400, kind="tpu")  # stays PENDING
    done(loc.nodes().simulateMaintenanceEvent(name=name, body={}).execute())
    upcoming = loc.nodes().get(name=name).execute()["upcomingMaintenance"]
    assert upcoming["type"] == "SCHEDULED" and upcoming["maintenanceStatus"] == "PENDING"
    done(loc.nodes().performMaintenance(name=name, body={}).execute())
    down = loc.nodes().get(name=name).execute()
    assert down["state"] == "REPAIRING" and down["upcomingMaintenance"]["maintenanceStatus"] == "ONGOING"
    until(lambda: loc.nodes().get(name=name).execute()["state"] == "READY", "READY after maintenance")
    assert "upcomingMaintenance" not in loc.nodes().list(parent=parent).execute()["nodes"][0]

    qr_name = f"{parent}/queuedResources/aq"
    done(
        loc.queuedResources()
        .create(
            parent=parent,
            queuedResourceId="aq",
            body={
                "tpu": {
                    "nodeSpec": [
                        {
                            "parent": parent,
                            "nodeId": "aqnode",
                            "node": {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e"},
                        }
                    ]
                },
                "spot": {},
            },
        )
        .execute()
    )
    until(lambda: loc.queuedResources().get(name=qr_name).execute()["state"]["state"] == "ACTIVE", "ACTIVE")
    listed = loc.queuedResources().list(parent=parent).execute()["queuedResources"]
    assert [q["name"] for q in listed] == [qr_name]
    done(loc.queuedResources().delete(name=qr_name, force=True).execute())

    assert done(loc.nodes().delete(name=name).execute())["response"]["@type"].endswith("protobuf.Empty")
    assert loc.nodes().list(parent=parent).execute() == {}
    _strict_and_clean(lc)


def test_compute_lifecycle_with_google_cloud_compute(lc: RunningLocalCloud, compute: Compute) -> None:
    """compute_v1: GPU VM insert/stop/start, simulate + perform maintenance, serial port, catalog,
    quotas, delete; every Instance/Operation/list answer validated against compute.v1.json."""
    from google.cloud import compute_v1  # here, not at the top: see localcloud/conftest.py

    project = lc.project
    assert {a.name for a in compute.accelerator_types.list(project=project, zone=ZONE)} >= {"nvidia-l4"}
    assert any(m.name == "g2-standard-4" for m in compute.machine_types.list(project=project, zone=ZONE))
    assert compute.regions.get(project=project, region="us-central1").status == "UP"
    script = "echo booted\nwhile true; do sleep 0.1; done\n"
    op = compute.wait(
        compute.instances.insert(
            project=project,
            zone=ZONE,
            instance_resource=gpu_instance("vm", script=script, labels={"run": "life"}, automatic_restart=True),
        )
    )
    assert op.status == compute_v1.Operation.Status.DONE and not op.error.errors
    assert compute.get("vm").status == "RUNNING"
    listed = compute.instances.list(
        request=compute_v1.ListInstancesRequest(project=project, zone=ZONE, filter="labels.run = life")
    )
    assert [i.name for i in listed] == ["vm"]
    compute.wait(compute.instances.stop(project=project, zone=ZONE, instance="vm"))
    assert compute.get("vm").status == "TERMINATED"
    compute.wait(compute.instances.start(project=project, zone=ZONE, instance="vm"))
    assert compute.get("vm").status == "RUNNING"

    lc.admin.next_maintenance("SCHEDULED", notice_seconds=86400, kind="gce")
    compute.instances.simulate_maintenance_event(
        request={"project": project, "zone": ZONE, "instance": "vm", "with_extended_notifications": True}
    )
    assert compute.get("vm").resource_status.upcoming_maintenance.maintenance_status == "PENDING"
    compute.instances.perform_maintenance(project=project, zone=ZONE, instance="vm")
    down = compute.get("vm")
    assert down.status in ("STOPPING", "TERMINATED")
    assert down.resource_status.upcoming_maintenance.maintenance_status == "ONGOING"
    until(lambda: compute.get("vm").status == "RUNNING", "RUNNING after maintenance")
    until(
        lambda: (
            "booted" in compute.instances.get_serial_port_output(project=project, zone=ZONE, instance="vm").contents
        ),
        "serial output",
    )

    compute.wait(compute.instances.delete(project=project, zone=ZONE, instance="vm"))
    with pytest.raises(exceptions.NotFound):
        compute.get("vm")
    assert list(compute.instances.list(project=project, zone=ZONE)) == []
    assert all(o.status == compute_v1.Operation.Status.DONE for o in compute.ops.list(project=project, zone=ZONE))
    _strict_and_clean(lc)
