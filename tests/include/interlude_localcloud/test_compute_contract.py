"""Google's Compute Engine contract as clients rely on it, through google-cloud-compute's InstancesClient (the client
the Google provider's ComputeEngineHook uses) pointed at the local cloud: an External NAT access config keeps
its natIP, setMetadata with fingerprint locking (seen by the guest's metadata server), setMachineType on a stopped
instance only, and 501 (not 404) for a method the local cloud does not implement. One local cloud for the module.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from google.api_core import exceptions

from interlude_localcloud.testing import RunningLocalCloud, running_localcloud
from tests.include.interlude_localcloud.conftest import ZONE, Compute, fast_scenario, gpu_instance


@pytest.fixture(scope="module")
def cloud() -> Iterator[tuple[RunningLocalCloud, Compute]]:
    with running_localcloud(fast_scenario(), gcs=False, strict=True) as lc:
        yield lc, Compute(lc.api_endpoint, lc.project)
        assert lc.violations == []


def _with_nat(name: str, nat: bool = True) -> Any:
    from google.cloud import compute_v1  # here, not at the top: see localcloud/conftest.py

    inst = gpu_instance(name, machine_type="n1-standard-4")
    configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")] if nat else []
    inst.network_interfaces = [compute_v1.NetworkInterface(network="global/networks/default", access_configs=configs)]
    return inst


def test_external_nat_gets_a_unique_nat_ip(cloud: tuple[RunningLocalCloud, Compute]) -> None:
    lc, compute = cloud
    for name, nat in (("nat-a", True), ("nat-b", True), ("no-nat", False)):
        compute.wait(compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=_with_nat(name, nat)))
    a, b = (compute.get(n).network_interfaces[0] for n in ("nat-a", "nat-b"))
    nat_ips = [nic.access_configs[0].nat_i_p for nic in (a, b)]
    doc_ranges = [ipaddress.ip_network("203.0.113.0/24"), ipaddress.ip_network("198.51.100.0/24")]
    assert all(any(ipaddress.ip_address(ip) in net for net in doc_ranges) for ip in nat_ips), nat_ips
    assert len(set(nat_ips)) == 2
    assert a.access_configs[0].type_ == "ONE_TO_ONE_NAT" and a.access_configs[0].name == "External NAT"
    assert a.network.endswith(f"/projects/{lc.project}/global/networks/default")
    internal = [compute.get(n).network_interfaces[0].network_i_p for n in ("nat-a", "nat-b", "no-nat")]
    assert len(set(internal)) == 3 and all(ipaddress.ip_address(ip).is_private for ip in internal)
    assert not compute.get("no-nat").network_interfaces[0].access_configs  # no access config, no external IP
    # What the provider's get_instance_address reads, over plain REST: networkInterfaces[0].accessConfigs[0].natIP
    raw = requests.get(f"{lc.api_endpoint}/compute/v1/projects/{lc.project}/zones/{ZONE}/instances/nat-a", timeout=5)
    assert raw.json()["networkInterfaces"][0]["accessConfigs"][0]["natIP"] == nat_ips[0]
    # An ephemeral natIP is released while the instance is stopped and a free one assigned when it starts.
    compute.wait(compute.instances.stop(project=lc.project, zone=ZONE, instance="nat-b"))
    stopped = compute.get("nat-b").network_interfaces[0].access_configs[0]
    assert not stopped.nat_i_p and stopped.name == "External NAT"
    compute.wait(compute.instances.start(project=lc.project, zone=ZONE, instance="nat-b"))
    restarted = compute.get("nat-b").network_interfaces[0].access_configs[0].nat_i_p
    assert restarted and restarted != nat_ips[0]


def _metadata(lc: RunningLocalCloud, name: str, key: str, query: str = "") -> requests.Response:
    url = f"{lc.api_endpoint}/_machines/gce-{ZONE}-{name}/computeMetadata/v1/instance/attributes/{key}{query}"
    return requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=15)


def test_set_metadata_checks_the_fingerprint_and_reaches_the_guest(cloud: tuple[RunningLocalCloud, Compute]) -> None:
    from google.cloud import compute_v1  # see above

    lc, compute = cloud
    compute.wait(compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=gpu_instance("md")))
    first = compute.get("md").metadata.fingerprint
    assert first and _metadata(lc, "md", "run-id").status_code == 404
    etag = _metadata(lc, "md", "").headers["ETag"]
    seen: list[requests.Response] = []  # a guest long-polling its attributes while the metadata changes
    poll = threading.Thread(
        target=lambda: seen.append(_metadata(lc, "md", "", f"?wait_for_change=true&timeout_sec=10&last_etag={etag}"))
    )
    poll.start()
    op = compute.instances.set_metadata(
        project=lc.project,
        zone=ZONE,
        instance="md",
        metadata_resource=compute_v1.Metadata(fingerprint=first, items=[compute_v1.Items(key="run-id", value="r7")]),
    )
    assert compute.wait(op).operation_type == "setMetadata"
    poll.join(timeout=15)
    assert seen and seen[0].text == "run-id\n"
    vm = compute.get("md")
    assert [(i.key, i.value) for i in vm.metadata.items] == [("run-id", "r7")] and vm.metadata.fingerprint != first
    assert _metadata(lc, "md", "run-id").text == "r7"
    with pytest.raises(exceptions.PreconditionFailed) as stale:  # 412: someone changed it since `first` was read
        compute.instances.set_metadata(
            project=lc.project,
            zone=ZONE,
            instance="md",
            metadata_resource=compute_v1.Metadata(fingerprint=first, items=[compute_v1.Items(key="x", value="y")]),
        )
    assert "Supplied fingerprint does not match current metadata fingerprint." in str(stale.value)
    assert _metadata(lc, "md", "run-id").text == "r7" and _metadata(lc, "md", "x").status_code == 404


def test_set_machine_type_only_when_stopped(cloud: tuple[RunningLocalCloud, Compute]) -> None:
    from google.cloud import compute_v1  # see above

    lc, compute = cloud

    def set_type(machine_type: str) -> Any:
        return compute.instances.set_machine_type(
            project=lc.project,
            zone=ZONE,
            instance="mt",
            instances_set_machine_type_request_resource=compute_v1.InstancesSetMachineTypeRequest(
                machine_type=f"zones/{ZONE}/machineTypes/{machine_type}"
            ),
        )

    compute.wait(compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=gpu_instance("mt")))
    with pytest.raises(exceptions.BadRequest):
        set_type("g2-standard-24")  # RUNNING
    compute.wait(compute.instances.stop(project=lc.project, zone=ZONE, instance="mt"))
    with pytest.raises(exceptions.BadRequest):
        set_type("a9-nonsense-1g")
    assert compute.wait(set_type("g2-standard-24")).operation_type == "setMachineType"
    assert compute.get("mt").machine_type.endswith("/machineTypes/g2-standard-24")
    compute.wait(compute.instances.start(project=lc.project, zone=ZONE, instance="mt"))
    # the new type's GPUs (2 L4 on a g2-standard-24) are what the running instance holds against quota
    quotas = {q.metric: q.usage for q in compute.regions.get(project=lc.project, region="us-central1").quotas}
    assert compute.get("mt").status == "RUNNING" and quotas["NVIDIA_L4_GPUS"] >= 2.0


def test_unimplemented_method_is_501_and_a_missing_instance_stays_404(
    cloud: tuple[RunningLocalCloud, Compute],
) -> None:
    from google.cloud import compute_v1  # see above

    lc, compute = cloud
    with pytest.raises(exceptions.MethodNotImplemented):
        compute.instances.set_labels(
            project=lc.project,
            zone=ZONE,
            instance="whatever",
            instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(labels={"a": "b"}),
        )
    base = f"{lc.api_endpoint}/compute/v1/projects/{lc.project}"
    for method, path in (("POST", f"/zones/{ZONE}/instances/x/setTags"), ("GET", "/global/images"), ("PATCH", "")):
        r = requests.request(method, base + path, json={}, timeout=5)
        err = r.json()["error"]
        assert (r.status_code, err["code"], err["status"]) == (501, 501, "UNIMPLEMENTED"), (method, path, r.text)
        assert err["errors"][0]["reason"] == "notImplemented"
    with pytest.raises(exceptions.NotFound):
        compute.get("never-made")
