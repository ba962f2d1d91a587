"""Node maintenance and spot preemption as GKE does them, on nodes without pods (fast; no processes)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from interlude_localcloud import scenario as scenario_mod
from interlude_localcloud.gke.controllers import NODES
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
    window = lc.admin.gke_node_maintenance(c.spec.name, name, notice_in=0, window_in=30 * 24 * 3600)
    labels = wait_for("the notice label", lambda: store.get(NODES, "", name)["metadata"]["labels"].get(SCHEDULED))
    assert int(labels) == int(window)
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
