"""Shared fixtures: a fast local cloud (large time_scale) and the real Google clients pointed at it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2

from interlude_localcloud.scenario import Scenario, parse
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud

# compute_v1 is imported where it is used, not here: its import costs ~1.2 CPU-s (thousands of proto-plus message
# classes), and every pytest-xdist worker collects every test file, while few run the GCE tests.
if TYPE_CHECKING:
    from google.cloud import compute_v1

ZONE = "us-central1-a"

# One simulated hour passes in one real second; maintenance windows last 1-2 s so a poller sees them.
FAST: dict[str, Any] = {
    "project": "test-proj",
    "time_scale": 3600,
    "stop_grace_seconds": 1,
    "zones": {
        ZONE: {
            "region": "us-central1",
            "tpu": {
                "accelerator_types": ["v5litepod-8", "v6e-8"],
                "runtime_versions": ["v2-alpha-tpuv5-lite", "v2-alpha-tpuv6e"],
                "capacity": {"v6e-8": {"on_demand": 4, "spot": 4}, "v5litepod-8": 1},
            },
            "gpu": {
                "accelerator_types": ["nvidia-l4", "nvidia-tesla-t4", "nvidia-h100-80gb"],
                "machine_types": ["g2-standard-4", "g2-standard-24", "n1-standard-4", "a3-highgpu-8g"],
                "capacity": {"nvidia-l4": {"on_demand": 4, "spot": 4}, "nvidia-tesla-t4": 2, "nvidia-h100-80gb": 8},
            },
        },
    },
    "regions": {"us-central1": {"quotas": {"NVIDIA_L4_GPUS": 3, "NVIDIA_T4_GPUS": 8}}},
    "delays": {
        "tpu_create": 360,
        "tpu_delete": 180,
        "tpu_start": 360,
        "tpu_stop": 180,
        "queue_accept": 180,
        "gce_create": 360,
        "gce_delete": 180,
        "gce_start": 360,
        "gce_stop": 180,
    },
    "maintenance": {
        "tpu": {"scheduled_notice": 7200, "unscheduled_notice": 1800, "duration": 5400},
        "gce": {"scheduled_notice": 3600, "unscheduled_notice": 1800, "duration": 5400},
    },
}


def metadata_gets_in_flight() -> int:
    """Server threads currently inside the metadata server's GET (found by walking their stacks): a long-poll
    that has reached the in-process local cloud and not been answered yet."""
    from interlude_localcloud.metadata_api import MetadataApi

    count = 0
    for frame in sys._current_frames().values():
        f: FrameType | None = frame
        while f is not None:
            if f.f_code is MetadataApi.get.__code__:
                count += 1
                break
            f = f.f_back
    return count


def fast_scenario(**overrides: Any) -> Scenario:
    raw = {**FAST, **overrides}
    return parse(raw)


@pytest.fixture
def lc() -> Iterator[RunningLocalCloud]:
    with running_localcloud(fast_scenario(), gcs=False, strict=True) as cloud:
        yield cloud
        assert cloud.violations == []


@pytest.fixture
def tpu(lc: RunningLocalCloud) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest", client_options={"api_endpoint": lc.api_endpoint}, credentials=AnonymousCredentials()
    )


class Compute:
    """The compute_v1 clients a GCE user needs, all on the local endpoint."""

    def __init__(self, endpoint: str, project: str) -> None:
        from google.cloud import compute_v1  # see the note above TYPE_CHECKING

        opts = {"api_endpoint": endpoint}
        creds = AnonymousCredentials()
        self.project = project
        self.instances = compute_v1.InstancesClient(client_options=opts, credentials=creds)
        self.ops = compute_v1.ZoneOperationsClient(client_options=opts, credentials=creds)
        self.regions = compute_v1.RegionsClient(client_options=opts, credentials=creds)
        self.accelerator_types = compute_v1.AcceleratorTypesClient(client_options=opts, credentials=creds)
        self.machine_types = compute_v1.MachineTypesClient(client_options=opts, credentials=creds)

    def wait(self, op: Any, zone: str = ZONE) -> compute_v1.Operation:
        """Poll with our own ZoneOperationsClient (ExtendedOperation.result() would go to Google)."""
        return self.ops.wait(project=self.project, zone=zone, operation=op.name)

    def get(self, name: str, zone: str = ZONE) -> compute_v1.Instance:
        return self.instances.get(project=self.project, zone=zone, instance=name)


@pytest.fixture
def compute(lc: RunningLocalCloud) -> Compute:
    return Compute(lc.api_endpoint, lc.project)


def gpu_instance(
    name: str,
    machine_type: str = "g2-standard-4",
    spot: bool = False,
    script: str | None = None,
    labels: dict[str, str] | None = None,
    zone: str = ZONE,
    **sched: Any,
) -> compute_v1.Instance:
    from google.cloud import compute_v1  # see the note above TYPE_CHECKING

    items = [compute_v1.Items(key="startup-script", value=script)] if script else []
    return compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{machine_type}",
        labels=labels or {},
        scheduling=compute_v1.Scheduling(
            on_host_maintenance="TERMINATE", provisioning_model="SPOT" if spot else "STANDARD", **sched
        ),
        metadata=compute_v1.Metadata(items=items),
    )
