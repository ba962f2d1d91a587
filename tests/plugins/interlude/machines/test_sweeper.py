"""The sweeper's selection over every combination: delete only on positive evidence of a finished run."""

from __future__ import annotations

import itertools

import pytest

from interlude import naming
from interlude.machines.sweeper import ACTIVE, FINISHED, Labelled, labelled, select, verdict

DAG = "interlude_training"
RUN = "manual__2026-01-01T00:00:00+00:00"
KEY = naming.run_key(DAG, RUN)
STATES = [*sorted(FINISHED), *sorted(ACTIVE), None, "up_for_retry", ""]


def machine(dag_id: str | None = DAG, run_id: str | None = RUN, run_key: str = KEY) -> Labelled:
    return Labelled("tpu_node", "us-central1-a", f"{run_key}-tpu", run_key, dag_id, run_id)


@pytest.mark.parametrize(("named", "matching", "state"), list(itertools.product([True, False], [True, False], STATES)))
def test_every_combination(named: bool, matching: bool, state: str | None) -> None:
    m = machine(run_key=KEY if matching else naming.run_key(DAG, "other")) if named else machine(None, None)
    v = verdict(m, state)
    assert v.delete is (named and matching and state in FINISHED), v.reason
    assert v.reason.startswith("delete" if v.delete else "keep")


def test_select_treats_a_missing_state_as_unknown() -> None:
    done, live = machine(), machine(run_id="live", run_key=naming.run_key(DAG, "live"))
    verdicts = select([done, live], {(DAG, RUN): "success"})
    assert [v.delete for v in verdicts] == [True, False]
    assert "unknown" in verdicts[1].reason


def test_labelled_reads_nodes_vms_and_queued_resources() -> None:
    labels = naming.labels(KEY, DAG)
    meta = {"interlude-dag-id": DAG, "interlude-run-id": RUN}
    node = {"name": f"projects/p/locations/z/nodes/{KEY}-tpu", "labels": labels, "metadata": meta}
    vm = {
        "name": f"{KEY}-vm",
        "labels": labels,
        "metadata": {"items": [{"key": k, "value": v} for k, v in meta.items()]},
    }
    qr = {
        "name": f"projects/p/locations/z/queuedResources/{KEY}-tpu-qr",
        "tpu": {"nodeSpec": [{"node": {"labels": labels, "metadata": meta}}]},
    }
    for kind, item in (("tpu_node", node), ("gce_vm", vm), ("queued_resource", qr)):
        found = labelled(kind, "z", item)
        assert found is not None and found.run == (DAG, RUN) and found.run_key == KEY, kind
    assert labelled("tpu_node", "z", {"name": "x", "labels": {"interlude-run": KEY}}) is None  # not managed-by
    assert labelled("tpu_node", "z", {"name": "x"}) is None


def test_labelled_reads_a_gke_node_pool_from_its_node_config() -> None:
    """A run's node pool (interlude.machines.gke): labels and metadata on the pool's node config, as the Container
    API lists it; its path names the cluster."""
    labels = naming.labels(KEY, DAG)
    meta = {"interlude-dag-id": DAG, "interlude-run-id": RUN}
    pool = {"name": "il-abc", "config": {"labels": labels, "metadata": meta, "machine_type": "ct6e-standard-4t"}}
    found = labelled("gke_node_pool", "us-central1/train", pool)
    assert found is not None and found.run == (DAG, RUN) and found.run_key == KEY
    assert found.path() == "locations/us-central1/clusters/train/nodePools/il-abc"
    assert verdict(found, "failed").delete and not verdict(found, "running").delete
    assert labelled("gke_node_pool", "us-central1/train", {"name": "default-pool", "config": {}}) is None
    assert labelled("gke_node_pool", "us-central1/train", {"name": "il-x", "labels": labels}) is None  # pool's own
