"""TPU stockout at deploy time: the ComputeClass's second priority (L4) serves, and how long it took is printed
(scenario seconds from the first failed TPU scale-up to the pod bound to an L4 node, and wall seconds from the
apply to the GPU replica Ready). The fallback here is GKE's (the class's priorities), not an Interlude step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from tests.e2e.test_serving_dag import Serving, deploy_conf, pods, run, started, xcom

pytestmark = pytest.mark.e2e


@pytest.fixture
def serving(tmp_path: Path, migrated_airflow_db: Path) -> Iterator[Serving]:
    with started(tmp_path, migrated_airflow_db) as s:
        yield s


def test_tpu_stockout_serves_on_l4_and_prints_the_time_to_a_gpu_replica(serving: Serving) -> None:
    s = serving
    s.cloud.admin.gke_stockout("us-central1-a", "ct6e-standard-1t")
    state, states, log = run(s, deploy_conf(s))
    assert state == "success", f"{states}\n{log[-4000:]}"
    (pod,) = pods(s)
    node = client.CoreV1Api(s.api).read_node(pod.spec.node_name)
    assert node.metadata.labels.get("cloud.google.com/gke-accelerator") == "nvidia-l4", node.metadata.labels
    assert xcom(s, "report")["pods_per_accelerator"] == {"gpu": 1}
    assert xcom(s, "smoke")["fingerprint"] == f"ckpt-{s.manifest_sha256[:16]}"
    events = s.cloud.admin.gke_events("interlude-serving")["events"]
    failed = [e["t"] for e in events if e["kind"] == "ScaleUpFailed"]
    bound = [e["t"] for e in events if e["kind"] == "Scheduled" and e.get("pod") == pod.metadata.name]
    assert failed and bound, events[-20:]
    first_ready = xcom(s, "report")["first_ready_seconds"]
    print(
        f"TPU stockout -> GPU replica: bound to L4 {bound[0] - failed[0]:.0f} scenario seconds after the first "
        f"failed TPU scale-up; Ready {first_ready:.1f} wall seconds after the apply"
    )
