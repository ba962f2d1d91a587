"""A real local cloud (include/interlude_localcloud) for the hook tests, with a scenario made for them.

Timings are scaled down so operations finish in a fraction of a second; scheduled maintenance notices
stay long so ``upcomingMaintenance`` can be read while it is PENDING.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from interlude.hooks._retry import RetryPolicy

PROJECT = "hooks-test-project"
TPU_ZONE = "us-east5-b"
GPU_ZONE = "us-central1-a"
GPU_REGION = "us-central1"

# Fast enough for tests, patient enough to ride out the injected 503 bursts (5 failures).
FAST_RETRY = RetryPolicy(max_attempts=6, initial_delay=0.02, max_delay=0.1)

SCENARIO: dict[str, Any] = {
    "project": PROJECT,
    "time_scale": 1.0,
    "zones": {
        TPU_ZONE: {
            "region": "us-east5",
            "tpu": {
                "accelerator_types": ["v6e-8", "v5litepod-8"],
                "runtime_versions": ["v2-alpha-tpuv6e", "v2-alpha-tpuv5-lite"],
                # v6e: one node fits, the second is a stockout; v5e: capacity for 3 but quota for 1.
                "capacity": {"v6e-8": 1, "v5litepod-8": 3},
                "quota": {"v5litepod": 8},
            },
        },
        GPU_ZONE: {
            "region": GPU_REGION,
            "gpu": {
                "accelerator_types": ["nvidia-l4", "nvidia-tesla-t4"],
                "machine_types": ["g2-standard-8", "g2-standard-24", "n1-standard-8"],
                # L4: one 1-GPU VM fits the zone; T4: plenty of capacity but a regional quota of 1 GPU.
                "capacity": {"nvidia-l4": 1, "nvidia-tesla-t4": 8},
                "reservations": [
                    {
                        "name": "l4-res",
                        "count": 2,
                        "in_use": 1,
                        "machine_type": "g2-standard-8",
                        "accelerator_type": "nvidia-l4",
                        "accelerator_count": 1,
                    },
                ],
            },
        },
    },
    "regions": {GPU_REGION: {"quotas": {"NVIDIA_L4_GPUS": 8, "NVIDIA_T4_GPUS": 1, "CPUS": 96}}},
    "delays": {
        "tpu_create": 0.3,
        "tpu_delete": 0.2,
        "tpu_start": 0.2,
        "tpu_stop": 0.2,
        "queue_accept": 0.2,
        "gce_create": 0.3,
        "gce_delete": 0.2,
        "gce_start": 0.2,
        "gce_stop": 0.2,
    },
    "maintenance": {
        "tpu": {"scheduled_notice": 3600, "unscheduled_notice": 3600, "duration": 1},
        "gce": {"scheduled_notice": 3600, "unscheduled_notice": 3600, "duration": 1},
    },
    "stop_grace_seconds": 0.5,
}


@pytest.fixture(scope="package")
def localcloud() -> Iterator[Any]:
    """One strict local cloud for the whole hooks test package (strict: answers validated vs discovery)."""
    from interlude_localcloud import scenario as scenario_mod
    from interlude_localcloud.testing import running_localcloud

    with running_localcloud(scenario_mod.parse(SCENARIO), strict=True, gcs=False) as lc:
        yield lc
        assert lc.violations == []
