"""A node pool create in a stocked-out zone x machine type, through the real google-cloud-container client (strict
mode: every answer checked against container.v1's discovery document), ends as on Google: the operation DONE with
the managed instance group's GCE_STOCKOUT error, the pool in ERROR with no node until it is deleted
(https://cloud.google.com/kubernetes-engine/docs/troubleshooting/node-pools)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1

from interlude_localcloud.gke.controllers import NODES
from interlude_localcloud.testing import running_localcloud


def until(pred: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := pred():
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_pool_create_in_a_stockout_fails_its_operation_and_leaves_an_errored_pool_until_deleted() -> None:
    with running_localcloud("gke_serving_run", gcs=False, strict=True) as lc:
        state = next(iter(lc.cloud_gke().clusters.values()))
        cluster, location = state.spec.name, state.spec.location
        cm = container_v1.ClusterManagerClient(
            transport="rest", credentials=AnonymousCredentials(), client_options={"api_endpoint": lc.container_endpoint}
        )
        parent = f"projects/{lc.project}/locations/{location}/clusters/{cluster}"
        ops = f"projects/{lc.project}/locations/{location}/operations"
        zone = f"{location}-b" if location.count("-") == 1 else location

        def create(name: str) -> Any:
            op = cm.create_node_pool(
                parent=parent,
                node_pool=container_v1.NodePool(
                    name=name,
                    initial_node_count=1,
                    locations=[zone],
                    config=container_v1.NodeConfig(machine_type="ct6e-standard-4t"),
                    placement_policy=container_v1.NodePool.PlacementPolicy(tpu_topology="2x2"),
                ),
            )
            return until(
                lambda: (
                    (done := cm.get_operation(name=f"{ops}/{op.name}")).status == container_v1.Operation.Status.DONE
                    and done
                ),
                f"create of {name} DONE",
            )

        def nodes_of(pool: str) -> list[str]:
            return [
                n["metadata"]["name"]
                for n in state.kube.store.list(NODES, None)[0]
                if n["metadata"]["labels"].get("cloud.google.com/gke-nodepool") == pool
            ]

        lc.admin.gke_stockout(zone, "ct6e-standard-4t")
        failed = create("tpu-out")
        assert "[GCE_STOCKOUT]" in failed.error.message and failed.error.code == 8, failed
        assert f"The zone 'projects/{lc.project}/zones/{zone}' does not have enough resources" in failed.error.message
        pool = cm.get_node_pool(name=f"{parent}/nodePools/tpu-out")
        assert pool.status == container_v1.NodePool.Status.ERROR and "GCE_STOCKOUT" in pool.status_message
        assert nodes_of("tpu-out") == [], "no node while the zone has none"

        op = cm.delete_node_pool(name=f"{parent}/nodePools/tpu-out")
        until(lambda: cm.get_operation(name=f"{ops}/{op.name}").status == container_v1.Operation.Status.DONE, "delete")
        assert "tpu-out" not in {p.name for p in cm.list_node_pools(parent=parent).node_pools}

        lc.admin.gke_stockout(zone, "ct6e-standard-4t", stockout=False)
        ok = create("tpu-back")
        assert not ok.error.message, ok
        assert cm.get_node_pool(name=f"{parent}/nodePools/tpu-back").status == container_v1.NodePool.Status.RUNNING
        assert len(nodes_of("tpu-back")) == 1
        assert lc.violations == []
