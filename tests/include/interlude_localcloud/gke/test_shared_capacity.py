"""One capacity engine for TPU VMs, Compute instances and GKE nodes, in both directions: a GKE TPU node holds
the zone's TPU capacity as a TPU VM does (Google draws both from the same zonal capacity), so a TPU VM create
is a stockout while the node lives, and succeeds once the node pool is resized to zero."""

from __future__ import annotations

import dataclasses
import time

import pytest
from google.api_core import exceptions as gexc
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1, tpu_v2

from interlude_localcloud import scenario as scenario_mod
from interlude_localcloud.testing import running_localcloud

ZONE = "us-central1-a"


def test_a_gke_tpu_node_holds_the_zones_tpu_capacity_for_tpu_vms() -> None:
    sc = scenario_mod.load("gke_serving_run")
    cluster = sc.gke_clusters[0]
    tpu_pool = dataclasses.replace(cluster.node_pools[0], initial_nodes=1, min_nodes=0)
    sc.gke_clusters[0] = dataclasses.replace(cluster, run=False, node_pools=[tpu_pool, *cluster.node_pools[1:]])
    with running_localcloud(sc, gcs=False) as lc:
        tpu = tpu_v2.TpuClient(
            credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": lc.api_endpoint}
        )
        parent = f"projects/{lc.project}/locations/{ZONE}"
        node = tpu_v2.Node(accelerator_type="v6e-1", runtime_version="v2-alpha-tpuv6e")
        # The zone holds one on-demand v6e-1 and the GKE node has it: Google answers a stockout.
        with pytest.raises(gexc.ResourceExhausted, match="no more capacity"):
            tpu.create_node(parent=parent, node_id="vm-while-node", node=node).result(timeout=60)

        # The pool resized to zero through the Container API: the capacity is the TPU API's again.
        gke = container_v1.ClusterManagerClient(
            credentials=AnonymousCredentials(),
            transport="rest",
            client_options={"api_endpoint": lc.container_endpoint},
        )
        name = f"projects/{lc.project}/locations/{cluster.location}/clusters/{cluster.name}/nodePools/{tpu_pool.name}"
        gke.set_node_pool_size(request={"name": name, "node_count": 0})
        created = None
        for attempt in range(60):
            try:
                created = tpu.create_node(parent=parent, node_id=f"vm-after-{attempt}", node=node).result(timeout=60)
                break
            except gexc.ResourceExhausted:  # the resize is an operation: the node goes after its delay
                time.sleep(0.5)
        assert created is not None and created.state == tpu_v2.Node.State.READY, created
