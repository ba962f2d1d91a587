"""Extra links go where the run ran: the local cloud's pages, or Google's console with the project."""

from __future__ import annotations

from typing import Any

import pytest

from interlude import naming
from interlude.operators.links import (
    Target,
    checkpoints_url,
    is_google_endpoint,
    machine_url,
    target_from_extras,
)

LOCAL = "http://127.0.0.1:8470"
TPU = {"kind": "tpu_node", "zone": "us-central1-a", "name": "run-1-tpu"}
VM = {"kind": "gce_vm", "zone": "us-east1-b", "name": "run-1-vm"}


@pytest.mark.parametrize(
    ("extras", "expected"),
    [
        ({"project": "p", "tpu_endpoint": LOCAL, "compute_endpoint": LOCAL}, Target("p", LOCAL)),
        ({"project": "p", "compute_endpoint": LOCAL + "/"}, Target("p", LOCAL)),
        (
            {"extra__google_cloud_platform__project": "p", "extra__google_cloud_platform__tpu_endpoint": LOCAL},
            Target("p", LOCAL),
        ),
        ({"project": "p"}, Target("p")),
        ({"project": "p", "tpu_endpoint": "https://tpu.googleapis.com"}, Target("p")),
        ({"project": "p", "tpu_endpoint": "https://tpu-myep.p.googleapis.com"}, Target("p")),
        ({}, Target(None)),
    ],
)
def test_target_from_the_connection_extras(extras: dict[str, Any], expected: Target) -> None:
    assert target_from_extras(extras) == expected


def test_google_endpoints_are_recognised_by_host_not_by_substring() -> None:
    assert is_google_endpoint("https://compute.googleapis.com")
    assert not is_google_endpoint("http://googleapis.com.example.org")
    assert not is_google_endpoint("http://127.0.0.1:8470/googleapis.com")


def test_links_on_the_local_cloud_open_its_pages() -> None:
    local = Target("interlude-local", LOCAL)
    assert machine_url(TPU, local) == f"{LOCAL}/_localcloud/pages/machines/tpu/us-central1-a/run-1-tpu"
    assert machine_url(VM, local) == f"{LOCAL}/_localcloud/pages/machines/gce/us-east1-b/run-1-vm"
    prefix = naming.checkpoint_prefix("run-1", "train")
    assert checkpoints_url("b-1", prefix, local) == f"{LOCAL}/_localcloud/pages/gcs/b-1/interlude/run-1/train/"


def test_links_on_google_open_the_console_of_the_project() -> None:
    google = Target("my-proj")
    assert machine_url(TPU, google) == (
        "https://console.cloud.google.com/compute/tpus/details/us-central1-a/run-1-tpu?project=my-proj"
    )
    assert machine_url(VM, google) == (
        "https://console.cloud.google.com/compute/instancesDetail/zones/us-east1-b/instances/run-1-vm?project=my-proj"
    )
    assert checkpoints_url("b-1", "interlude/run-1/train/", google) == (
        "https://console.cloud.google.com/storage/browser/b-1/interlude/run-1/train/?project=my-proj"
    )


def test_values_are_quoted_into_the_url() -> None:
    odd = {"kind": "tpu_node", "zone": "us-central1-a", "name": "x?project=evil#"}
    assert machine_url(odd, Target("p&q")).endswith("/x%3Fproject%3Devil%23?project=p%26q")
