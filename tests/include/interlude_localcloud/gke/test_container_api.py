"""The Container API v1 subset through the real google-cloud-container client, strict mode on."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests
from cryptography import x509
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, K8S_VERSION, LOCATION


def until(pred: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if got := pred():
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def cm(gke_lc: RunningLocalCloud) -> container_v1.ClusterManagerClient:
    return container_v1.ClusterManagerClient(
        transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": gke_lc.container_endpoint}
    )


def test_cluster_get_and_list_carry_endpoint_and_ca(
    gke_lc: RunningLocalCloud, cm: container_v1.ClusterManagerClient
) -> None:
    name = f"projects/{gke_lc.project}/locations/{LOCATION}/clusters/{CLUSTER}"
    cluster = cm.get_cluster(name=name)
    assert cluster.status == container_v1.Cluster.Status.RUNNING
    assert cluster.current_master_version == K8S_VERSION
    host, port = cluster.endpoint.split(":")
    assert host == "127.0.0.1" and int(port) > 0
    ca = x509.load_pem_x509_certificate(base64.b64decode(cluster.master_auth.cluster_ca_certificate))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # The API server's certificate verifies against that CA (and only a bearer token gets in).
    ca_file = gke_lc.state_dir / "test-ca.pem"
    ca_file.write_bytes(base64.b64decode(cluster.master_auth.cluster_ca_certificate))
    answer = requests.get(f"https://{cluster.endpoint}/version", verify=str(ca_file), timeout=10)
    assert answer.status_code == 401 and answer.json()["reason"] == "Unauthorized"
    assert {p.name for p in cluster.node_pools} == {"tpu-v6e", "l4-spot"}
    listed = cm.list_clusters(parent=f"projects/{gke_lc.project}/locations/-")
    assert [c.name for c in listed.clusters] == [CLUSTER]
    assert cm.list_clusters(parent=f"projects/{gke_lc.project}/locations/europe-west4").clusters == []
    with pytest.raises(exceptions.NotFound):
        cm.get_cluster(name=f"projects/{gke_lc.project}/locations/{LOCATION}/clusters/nope")


def test_node_pool_lifecycle_with_operations(gke_lc: RunningLocalCloud, cm: container_v1.ClusterManagerClient) -> None:
    parent = f"projects/{gke_lc.project}/locations/{LOCATION}/clusters/{CLUSTER}"
    ops = f"projects/{gke_lc.project}/locations/{LOCATION}/operations"
    tpu = cm.get_node_pool(name=f"{parent}/nodePools/tpu-v6e")
    assert tpu.config.machine_type == "ct6e-standard-4t" and tpu.placement_policy.tpu_topology == "2x2"
    gpu = cm.get_node_pool(name=f"{parent}/nodePools/l4-spot")
    assert gpu.config.spot and gpu.config.accelerators[0].accelerator_type == "nvidia-l4"
    assert gpu.autoscaling.max_node_count == 4
    assert [(t.key, t.value, t.effect) for t in gpu.config.taints] == [
        ("cloud.google.com/compute-class", "vllm", container_v1.NodeTaint.Effect.NO_SCHEDULE)
    ]
    assert gpu.config.labels["cloud.google.com/compute-class"] == "vllm"

    op = cm.create_node_pool(
        parent=parent,
        node_pool=container_v1.NodePool(
            name="l4-extra",
            initial_node_count=1,
            locations=["us-central1-c"],
            autoscaling=container_v1.NodePoolAutoscaling(enabled=True, min_node_count=0, max_node_count=3),
            config=container_v1.NodeConfig(
                machine_type="g2-standard-8",
                accelerators=[container_v1.AcceleratorConfig(accelerator_count=1, accelerator_type="nvidia-l4")],
            ),
        ),
    )
    assert op.operation_type == container_v1.Operation.Type.CREATE_NODE_POOL
    until(
        lambda: cm.get_operation(name=f"{ops}/{op.name}").status == container_v1.Operation.Status.DONE,
        "create operation DONE",
    )
    assert cm.get_node_pool(name=f"{parent}/nodePools/l4-extra").status == container_v1.NodePool.Status.RUNNING
    with pytest.raises(exceptions.Conflict):
        cm.create_node_pool(parent=parent, node_pool=container_v1.NodePool(name="l4-extra"))

    op = cm.set_node_pool_size(request={"name": f"{parent}/nodePools/l4-extra", "node_count": 3})
    assert op.operation_type == container_v1.Operation.Type.SET_NODE_POOL_SIZE
    until(lambda: cm.get_operation(name=f"{ops}/{op.name}").status == container_v1.Operation.Status.DONE, "resize DONE")
    assert cm.get_cluster(name=parent).current_node_count == 1 + 2 + 3

    op = cm.delete_node_pool(name=f"{parent}/nodePools/l4-extra")
    until(lambda: cm.get_operation(name=f"{ops}/{op.name}").status == container_v1.Operation.Status.DONE, "delete DONE")
    with pytest.raises(exceptions.NotFound):
        cm.get_node_pool(name=f"{parent}/nodePools/l4-extra")
    assert {p.name for p in cm.list_node_pools(parent=parent).node_pools} == {"tpu-v6e", "l4-spot"}


def test_answers_validate_in_strict_mode_and_int_enums(gke_lc: RunningLocalCloud) -> None:
    """Plain REST reads in both enum encodings; strict mode has seen no violation in this module."""
    base = f"{gke_lc.container_endpoint}/v1/projects/{gke_lc.project}/locations/{LOCATION}/clusters/{CLUSTER}"
    assert requests.get(base, timeout=10).json()["status"] == "RUNNING"
    as_int = requests.get(base, params={"$alt": "json;enum-encoding=int"}, timeout=10).json()
    assert as_int["status"] == container_v1.Cluster.Status.RUNNING.value
    assert gke_lc._lc.server is not None and gke_lc._lc.server.strict
    assert gke_lc.violations == [] and gke_lc.admin.violations() == []
