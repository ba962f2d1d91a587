"""Node maintenance and spot preemption as GKE does them, on nodes without pods (fast; no processes)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from interlude_localcloud import scenario as scenario_mod
from interlude_localcloud.gke.controllers import CLASSES, NODES, PODS
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud

SCHEDULED = "cloud.google.com/scheduled-maintenance-time"
ACTIVE = "cloud.google.com/active-node-maintenance"
PERFORM = "cloud.google.com/perform-maintenance"
TERMINATION = "cloud.google.com/impending-node-termination"


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def lc() -> Iterator[RunningLocalCloud]:
    sc = scenario_mod.load("gke_serving_run")
    pools = sc.gke_clusters[0].node_pools
    pools[1].min_nodes = pools[1].initial_nodes = 1  # one L4 node that stays
    spot = type(pools[1])(**{**vars(pools[1]), "name": "l4-spot", "spot": True, "min_nodes": 0, "initial_nodes": 1})
    pools.append(spot)
    with running_localcloud(sc, gcs=False) as running:
        yield running


def _node(lc: RunningLocalCloud, pool: str) -> dict[str, Any]:
    store = next(iter(lc.cloud_gke().clusters.values())).kube.store
    nodes, _ = store.list(NODES, None, lambda n: n["metadata"]["labels"]["cloud.google.com/gke-nodepool"] == pool)
    assert len(nodes) == 1
    return nodes[0]


def test_perform_maintenance_label_starts_it_early_and_spot_nodes_are_preempted(lc: RunningLocalCloud) -> None:
    c = next(iter(lc.cloud_gke().clusters.values()))
    store = c.kube.store
    name = _node(lc, "l4")["metadata"]["name"]
    asked_at = time.time()
    answer = lc.admin.gke_node_maintenance_window(c.spec.name, name, notice_in=0, window_in=30 * 24 * 3600)
    window = answer["window_start"]
    labels = wait_for("the notice label", lambda: store.get(NODES, "", name)["metadata"]["labels"].get(SCHEDULED))
    # Google's label is Unix epoch seconds of the wall clock: 30 scenario days ahead are 30 days / time_scale real
    assert int(labels) == int(answer["window_start_epoch"])
    scale = c.runtime.time_scale
    placed_from = int(labels) - 30 * 24 * 3600 / scale  # the moment the window was placed from, whole seconds
    assert asked_at <= placed_from + 1 and placed_from <= time.time(), (asked_at, labels)
    time.sleep(0.5)
    assert ACTIVE not in store.get(NODES, "", name)["metadata"]["labels"], "started before the window"

    def ask(cur: dict[str, Any]) -> dict[str, Any]:  # what a user (or Interlude's operator) does
        cur["metadata"]["labels"][PERFORM] = "true"
        cur["metadata"].pop("resourceVersion", None)
        return cur

    store.update(NODES, "", name, ask)
    node = wait_for(
        "maintenance started", lambda: (n := store.get(NODES, "", name))["metadata"]["labels"].get(ACTIVE) and n
    )
    assert any(t["key"] == TERMINATION for t in node["spec"].get("taints") or [])
    assert lc.admin.gke_events(c.spec.name)["now"] < window, "the label did not start it early"

    spot = _node(lc, "l4-spot")["metadata"]["name"]
    assert store.get(NODES, "", spot)["metadata"]["labels"]["cloud.google.com/gke-spot"] == "true"
    lc.admin.gke_preempt(c.spec.name, spot)
    wait_for("the spot node gone", lambda: not store.exists(NODES, "", spot))


def test_zone_capacity_of_the_scenario_sends_pods_to_the_next_priority() -> None:
    """No v6e-1 capacity left in the zone (the TPU API's capacity engine): the class's TPU priority cannot
    scale up, so the pod lands on an L4 node; the pod's command runs as a process there."""
    sc = scenario_mod.load("gke_serving_run")
    zone = sc.zones["us-central1-a"]
    zone.tpu_capacity["v6e-1"] = type(zone.tpu_capacity["v6e-1"])(on_demand=0, spot=0)
    with running_localcloud(sc, gcs=False) as running:
        c = next(iter(running.cloud_gke().clusters.values()))
        store = c.kube.store
        cc = {
            "apiVersion": "cloud.google.com/v1",
            "kind": "ComputeClass",
            "metadata": {"name": "interlude-vllm"},
            "spec": {
                "priorities": [
                    {"tpu": {"type": "tpu-v6e-slice", "count": 1, "topology": "1x1"}},
                    {"gpu": {"type": "nvidia-l4", "count": 1}},
                ],
                "whenUnsatisfiable": "DoNotScaleUp",
            },
        }
        store.create(CLASSES, "", cc)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper"},
            "spec": {
                "nodeSelector": {"cloud.google.com/compute-class": "interlude-vllm"},
                "tolerations": [
                    {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                ],
                "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "300"]}],
            },
        }
        store.create(PODS, "default", pod)
        node = wait_for("the pod bound", lambda: store.get(PODS, "default", "sleeper")["spec"].get("nodeName"))
        labels = store.get(NODES, "", node)["metadata"]["labels"]
        assert labels["cloud.google.com/gke-accelerator"] == "nvidia-l4"
        events = running.admin.gke_events(c.spec.name)["events"]
        assert not any(e["kind"] == "ScaleUp" and e["pool"] == "tpu-v6e-1x1" for e in events), events
        wait_for(
            "the pod running", lambda: store.get(PODS, "default", "sleeper").get("status", {}).get("phase") == "Running"
        )
        pids = c.runtime.pids()
    assert pids and not any(os.path.exists(f"/proc/{p}") and _not_zombie(p) for p in pids)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_compute_engine_simulates_a_host_maintenance_on_a_gke_nodes_vm_and_gke_shows_it_on_the_node(
    lc: RunningLocalCloud,
) -> None:
    """A GKE node is a Compute Engine instance of its name: Compute's simulateMaintenanceEvent on it (the real
    google-cloud-compute client) gives the node GKE's notice label, the window the scenario's Compute notice
    later, then the taint at the window. A name that is neither an instance nor a node is still notFound."""
    from google.api_core import exceptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import compute_v1

    c = next(iter(lc.cloud_gke().clusters.values()))
    store, scale = c.kube.store, c.runtime.time_scale
    node = _node(lc, "l4")
    name, zone = node["metadata"]["name"], node["metadata"]["labels"]["topology.kubernetes.io/zone"]
    instances = compute_v1.InstancesClient(
        client_options={"api_endpoint": lc.api_endpoint}, credentials=AnonymousCredentials()
    )
    asked_at = time.time()
    op = instances.simulate_maintenance_event(
        request={"project": lc.project, "zone": zone, "instance": name, "with_extended_notifications": True}
    )
    assert op.done() or op.result() is not None
    label = wait_for("the notice label", lambda: store.get(NODES, "", name)["metadata"]["labels"].get(SCHEDULED))
    notice = lc.cloud.scenario.maintenance["gce"]["scheduled_notice"]
    placed_from = int(label) - notice / scale  # the window is the notice after the ask (whole seconds)
    assert asked_at <= placed_from + 1 and placed_from <= time.time(), (asked_at, label, notice, scale)
    tainted = wait_for(
        "the taint at the window",
        lambda: any(t["key"] == TERMINATION for t in store.get(NODES, "", name)["spec"].get("taints") or []),
        timeout=30 + notice / scale,
    )
    assert tainted
    assert any(e.get("event") == "gke_node_maintenance" and e.get("node") == name for e in lc.admin.events())
    with pytest.raises(exceptions.NotFound):
        instances.simulate_maintenance_event(
            request={
                "project": lc.project,
                "zone": zone,
                "instance": "no-such-node",
                "with_extended_notifications": True,
            }
        )
