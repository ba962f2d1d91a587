"""One local cloud with a GKE cluster per module, and the Google provider's hooks pointed at it.

Used by the local GKE's tests here and by the serving triggers' tests (tests/plugins/interlude/triggers/): the
root conftest lists this module in `pytest_plugins`, so pytest finds `gke_lc` and `gke_conn` everywhere and no
test imports them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from interlude_localcloud.scenario import Scenario, parse
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud

LOCATION = "us-central1"
CLUSTER = "serving"
K8S_VERSION = "1.33.5-gke.1080000"

GKE_SCENARIO: dict[str, Any] = {
    "project": "gke-proj",
    "time_scale": 3600,
    "gke": {
        "clusters": [
            {
                "name": CLUSTER,
                "location": LOCATION,
                "kubernetes_version": K8S_VERSION,
                "node_pools": [
                    {
                        "name": "tpu-v6e",
                        "machine_type": "ct6e-standard-4t",
                        "tpu": {"accelerator": "tpu-v6e-slice", "topology": "2x2", "chips": 4},
                        "min_nodes": 0,
                        "max_nodes": 2,
                        "initial_nodes": 1,
                        "zones": ["us-central1-b"],
                    },
                    {
                        "name": "l4-spot",
                        "machine_type": "g2-standard-8",
                        "gpu": {"type": "nvidia-l4", "count": 1},
                        "min_nodes": 0,
                        "max_nodes": 4,
                        "initial_nodes": 2,
                        "spot": True,
                        "zones": ["us-central1-a"],
                        "compute_class": "vllm",
                    },
                ],
            }
        ]
    },
}


def gke_scenario() -> Scenario:
    return parse(GKE_SCENARIO)


@pytest.fixture(scope="module")
def gke_lc() -> Iterator[RunningLocalCloud]:
    with running_localcloud(gke_scenario(), gcs=False, strict=True) as cloud:
        yield cloud
        assert cloud.violations == []


@pytest.fixture(scope="module")
def gke_conn(gke_lc: RunningLocalCloud) -> Iterator[str]:
    """An Airflow connection (from the environment) holding only the local cloud's endpoints."""
    env = gke_lc.airflow_conn_env("interlude_gke_test")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield "interlude_gke_test"
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
