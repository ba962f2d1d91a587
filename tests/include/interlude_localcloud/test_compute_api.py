"""Compute Engine v1 through the real google-cloud-compute clients."""

from __future__ import annotations

import pytest
import requests
from google.api_core import exceptions

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import ZONE, Compute, gpu_instance


def test_insert_get_list_filter_delete(lc: RunningLocalCloud, compute: Compute) -> None:
    from google.cloud import compute_v1  # here, not at the top: see localcloud/conftest.py

    op = compute.instances.insert(
        project=lc.project, zone=ZONE, instance_resource=gpu_instance("vm-a", labels={"run": "r1"})
    )
    # 0.1 s of PROVISIONING is too short to assert on a loaded machine; the full PROVISIONING -> STAGING ->
    # RUNNING sequence is asserted with slower transitions in test_maintenance.test_compute_insert_passes_staging
    assert compute.get("vm-a").status in ("PROVISIONING", "STAGING", "RUNNING")
    done = compute.wait(op)
    assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors
    vm = compute.get("vm-a")
    assert vm.status == "RUNNING" and vm.machine_type.endswith("/machineTypes/g2-standard-4")
    assert vm.scheduling.on_host_maintenance == "TERMINATE" and vm.scheduling.provisioning_model == "STANDARD"
    compute.wait(
        compute.instances.insert(
            project=lc.project,
            zone=ZONE,
            instance_resource=compute_v1.Instance(
                name="vm-b",
                machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
                labels={"run": "r2"},
                guest_accelerators=[
                    compute_v1.AcceleratorConfig(
                        accelerator_type=f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", accelerator_count=1
                    )
                ],
                scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE"),
            ),
        )
    )
    listed = compute.instances.list(request={"project": lc.project, "zone": ZONE, "filter": "labels.run = r2"})
    assert [i.name for i in listed] == ["vm-b"]
    assert compute.get("vm-b").guest_accelerators[0].accelerator_type.endswith("nvidia-tesla-t4")
    assert sorted(i.name for i in compute.instances.list(project=lc.project, zone=ZONE)) == ["vm-a", "vm-b"]
    compute.wait(compute.instances.stop(project=lc.project, zone=ZONE, instance="vm-a"))
    assert compute.get("vm-a").status == "TERMINATED"
    compute.wait(compute.instances.start(project=lc.project, zone=ZONE, instance="vm-a"))
    assert compute.get("vm-a").status == "RUNNING"
    compute.wait(compute.instances.delete(project=lc.project, zone=ZONE, instance="vm-a"))
    with pytest.raises(exceptions.NotFound):
        compute.get("vm-a")
    serial = compute.instances.get_serial_port_output(project=lc.project, zone=ZONE, instance="vm-b")
    assert "boot #1" in serial.contents


def test_stockout_and_quota(lc: RunningLocalCloud, compute: Compute) -> None:
    # T4 capacity 2 GPUs: the third n1+T4 VM stocks out in the operation.
    from google.cloud import compute_v1  # here, not at the top: see localcloud/conftest.py

    def t4(name: str) -> compute_v1.Instance:
        return compute_v1.Instance(
            name=name,
            machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
            guest_accelerators=[
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4", accelerator_count=1
                )
            ],
            scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE"),
        )

    for n in ("t1", "t2"):
        assert not compute.wait(
            compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=t4(n))
        ).error.errors
    op = compute.wait(compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=t4("t3")))
    assert op.status == compute_v1.Operation.Status.DONE
    assert op.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    # Google's exact wording, two spaces between the sentences included.
    assert op.error.errors[0].message == (
        f"The zone 'projects/{lc.project}/zones/{ZONE}' does not have enough resources available to fulfill "
        "the request.  Try a different zone, or try again later."
    )
    with pytest.raises(exceptions.NotFound):
        compute.get("t3")
    # L4 quota 3 in the region: a g2-standard-24 (2 L4) fits, a second one does not -> 403 quotaExceeded.
    compute.wait(
        compute.instances.insert(
            project=lc.project, zone=ZONE, instance_resource=gpu_instance("l1", machine_type="g2-standard-24")
        )
    )
    with pytest.raises(exceptions.Forbidden) as err:
        compute.instances.insert(
            project=lc.project, zone=ZONE, instance_resource=gpu_instance("l2", machine_type="g2-standard-24")
        )
    assert "Quota 'NVIDIA_L4_GPUS' exceeded.  Limit: 3.0 in region us-central1." in str(err.value)
    raw = requests.post(
        f"{lc.api_endpoint}/compute/v1/projects/{lc.project}/zones/{ZONE}/instances",
        json={"name": "l3", "machineType": f"zones/{ZONE}/machineTypes/g2-standard-24"},
        timeout=5,
    )
    assert raw.status_code == 403 and raw.json()["error"]["errors"][0]["reason"] == "quotaExceeded"
    quotas = {
        q.metric: (q.limit, q.usage) for q in compute.regions.get(project=lc.project, region="us-central1").quotas
    }
    assert quotas["NVIDIA_L4_GPUS"] == (3.0, 2.0) and quotas["NVIDIA_T4_GPUS"] == (8.0, 2.0)


def test_catalog_and_errors(lc: RunningLocalCloud, compute: Compute) -> None:
    assert [a.name for a in compute.accelerator_types.list(project=lc.project, zone=ZONE)] == [
        "nvidia-l4",
        "nvidia-tesla-t4",
        "nvidia-h100-80gb",
    ]
    mts = {m.name: m for m in compute.machine_types.list(project=lc.project, zone=ZONE)}
    assert mts["a3-highgpu-8g"].accelerators[0].guest_accelerator_count == 8
    with pytest.raises(exceptions.BadRequest):
        compute.instances.insert(
            project=lc.project, zone=ZONE, instance_resource=gpu_instance("x", machine_type="a9-nonsense-1g")
        )
    compute.wait(compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=gpu_instance("d")))
    with pytest.raises(exceptions.Conflict):
        compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=gpu_instance("d"))
    r = requests.get(f"{lc.api_endpoint}/compute/v1/projects/{lc.project}/zones/{ZONE}/instances/none", timeout=5)
    err = r.json()["error"]
    assert r.status_code == 404 and err["code"] == 404 and err["errors"][0]["reason"] == "notFound"
    with pytest.raises(exceptions.NotFound):
        compute.ops.get(project=lc.project, zone=ZONE, operation="operation-none")
