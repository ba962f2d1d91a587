"""TPU VMs through Compute Engine (TPU machine types of the accelerator-optimized family), through
google-cloud-compute: the catalog per zone (TPU7x only where the scenario offers it), capacity in TPU chips,
regional quota per TPU family, reservations, maintenance as for GPU VMs, and the TPU chips and accelerator-type
metadata the guest sees. One local cloud for the module.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials

from interlude_localcloud.scenario import parse
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud
from tests.include.interlude_localcloud.conftest import FAST, ZONE, Compute, gpu_instance
from tests.include.interlude_localcloud.test_maintenance import metadata, until

EAST = "us-east5-a"
PROBE = """python - <<'PY'
import os, urllib.request
def md(key):
    req = urllib.request.Request(os.environ["INTERLUDE_METADATA_URL"] + "/instance/attributes/" + key,
                                 headers={"Metadata-Flavor": "Google"})
    return urllib.request.urlopen(req, timeout=10).read().decode()
chips = os.listdir(os.path.join(os.environ["INTERLUDE_DEVICE_ROOT"], "dev", "vfio"))
print(f"accel={md('accelerator-type')} chips={len(chips)} topology={'2x2x1' in md('tpu-env')}", flush=True)
PY
command -v nvidia-smi >/dev/null && nvidia-smi -L
"""


def _scenario() -> dict[str, Any]:
    raw = copy.deepcopy(FAST)
    gpu = raw["zones"][ZONE]["gpu"]
    gpu["tpu_machine_types"] = ["ct6e-standard-1t", "ct6e-standard-4t", "ct6e-standard-8t", "ct5p-hightpu-4t"]
    gpu["capacity"].update({"tpu-v6e-slice": {"on_demand": 8, "spot": 4}, "tpu-v5p-slice": 4})
    gpu["reservations"] = [{"name": "v6e-res", "machine_type": "ct6e-standard-4t", "count": 2, "in_use": 1}]
    raw["zones"][EAST] = {"gpu": {"tpu_machine_types": ["tpu7x-standard-4t"], "capacity": {"tpu7x": 4}}}
    raw["regions"]["us-central1"]["quotas"]["TPU_V6E_CHIPS"] = 12
    raw["maintenance"]["gce"]["duration"] = 3600  # host down 1 s: long enough for a poller to see TERMINATED
    return raw


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[RunningLocalCloud, Compute]]:
    with running_localcloud(parse(_scenario()), gcs=False, strict=True) as lc:
        yield lc, Compute(lc.api_endpoint, lc.project)
        assert lc.violations == []


def _insert(lc: RunningLocalCloud, compute: Compute, name: str, machine_type: str, zone: str = ZONE, **kw: Any) -> Any:
    inst = gpu_instance(name, machine_type=machine_type, zone=zone, **kw)
    return compute.wait(compute.instances.insert(project=lc.project, zone=zone, instance_resource=inst), zone=zone)


def test_catalog_reservations_and_tpu7x_only_where_offered(cloud: tuple[RunningLocalCloud, Compute]) -> None:
    from google.cloud import compute_v1  # here, not at the top: see localcloud/conftest.py

    lc, compute = cloud
    here = {m.name: m for m in compute.machine_types.list(project=lc.project, zone=ZONE)}
    v6e = here["ct6e-standard-4t"]
    assert (v6e.guest_cpus, v6e.memory_mb) == (180, 720 * 1024)
    assert [(a.guest_accelerator_type, a.guest_accelerator_count) for a in v6e.accelerators] == [("tpu-v6e-slice", 4)]
    assert here["ct5p-hightpu-4t"].guest_cpus == 208 and "tpu7x-standard-4t" not in here
    east = {m.name: m for m in compute.machine_types.list(project=lc.project, zone=EAST)}
    assert east["tpu7x-standard-4t"].accelerators[0].guest_accelerator_count == 4
    with pytest.raises(exceptions.BadRequest):  # no TPU7x in this zone
        _insert(lc, compute, "ironwood", "tpu7x-standard-4t")
    assert not _insert(lc, compute, "ironwood", "tpu7x-standard-4t", zone=EAST).error.errors
    assert compute.get("ironwood", zone=EAST).status == "RUNNING"
    reservations = compute_v1.ReservationsClient(
        client_options={"api_endpoint": lc.api_endpoint}, credentials=AnonymousCredentials()
    ).list(project=lc.project, zone=ZONE)
    [res] = list(reservations)
    assert res.specific_reservation.instance_properties.machine_type == "ct6e-standard-4t"
    assert (res.specific_reservation.count, res.specific_reservation.in_use_count) == (2, 1)


def test_capacity_in_chips_and_quota_per_family(cloud: tuple[RunningLocalCloud, Compute]) -> None:
    lc, compute = cloud
    migrating = gpu_instance("migrating", machine_type="ct6e-standard-4t")
    migrating.scheduling.on_host_maintenance = "MIGRATE"
    with pytest.raises(exceptions.BadRequest):  # TPU VMs cannot live-migrate
        compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=migrating)
    for name in ("v6e-a", "v6e-b"):  # 2 x 4 chips: the zone's 8 on-demand v6e chips
        assert not _insert(lc, compute, name, "ct6e-standard-4t").error.errors
    assert compute.get("v6e-a").scheduling.on_host_maintenance == "TERMINATE"
    stocked_out = _insert(lc, compute, "v6e-c", "ct6e-standard-1t")
    assert stocked_out.error.errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    with pytest.raises(exceptions.Forbidden) as quota:  # 8 held + 8 asked > 12
        _insert(lc, compute, "v6e-d", "ct6e-standard-8t")
    assert "Quota 'TPU_V6E_CHIPS' exceeded.  Limit: 12.0 in region us-central1." in str(quota.value)
    quotas = {q.metric for q in compute.regions.get(project=lc.project, region="us-central1").quotas}
    assert "TPU_V6E_CHIPS" not in quotas and "NVIDIA_L4_GPUS" in quotas  # a Cloud Quotas metric, as on Google
    compute.wait(compute.instances.delete(project=lc.project, zone=ZONE, instance="v6e-b"))
    assert not _insert(lc, compute, "v6e-c", "ct6e-standard-1t").error.errors  # the deleted VM's chips are free


def _serial(lc: RunningLocalCloud, compute: Compute, name: str) -> str:
    return compute.instances.get_serial_port_output(project=lc.project, zone=ZONE, instance=name).contents


def test_guest_sees_its_tpu_chips_and_goes_through_maintenance(cloud: tuple[RunningLocalCloud, Compute]) -> None:
    lc, compute = cloud
    _insert(lc, compute, "v5p", "ct5p-hightpu-4t", script=PROBE, automatic_restart=True)
    _insert(lc, compute, "l4", "g2-standard-4", script=PROBE)
    until(lambda: "accel=v5p-8 chips=4 topology=True" in _serial(lc, compute, "v5p"), what="TPU VM probe")
    until(lambda: "GPU 0: nvidia-l4" in _serial(lc, compute, "l4"), what="GPU VM probe")
    assert "nvidia-smi" not in _serial(lc, compute, "v5p") and "GPU 0" not in _serial(lc, compute, "v5p")
    lc.admin.next_maintenance("SCHEDULED", notice_seconds=86400, kind="gce")  # a day's notice: PENDING stays
    compute.instances.simulate_maintenance_event(
        request={"project": lc.project, "zone": ZONE, "instance": "v5p", "with_extended_notifications": True}
    )
    up = compute.get("v5p").resource_status.upcoming_maintenance
    assert (up.maintenance_status, up.type_, up.can_reschedule) == ("PENDING", "SCHEDULED", True)
    assert metadata(lc, "gce", "v5p", "instance/maintenance-event").text == "TERMINATE_ON_HOST_MAINTENANCE"
    compute.instances.perform_maintenance(project=lc.project, zone=ZONE, instance="v5p")  # start it now
    until(lambda: compute.get("v5p").status == "TERMINATED", what="down for maintenance")
    until(lambda: compute.get("v5p").status == "RUNNING", what="back (automaticRestart)")
    until(lambda: _serial(lc, compute, "v5p").count("accel=v5p-8 chips=4") == 2, what="second boot's probe")
