"""A v6e run on a Compute Engine TPU machine type (ct6e-standard-8t) keeps the VM path's promises (issue 35).

The training DAG (Airflow's own `dags test`) on a local cloud whose us-central1-a sells v6e TPU VMs through
Compute Engine, with ``platforms: [compute]``: the run is an `instances.insert` of a ct6e-standard-8t (no Cloud
TPU API call at all, from the cloud's own event log and its view of the instance), a simulated maintenance is
drilled in both stages (train and fine-tune), the workload's own log shows where it held and resumed (0 steps
recomputed), the final weights equal the uninterrupted reference run's, and no machine is left.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from interlude_dev import scenario
from interlude_dev import wiring as dev

from .stage_fixtures import boots, drilled_stages, final_digest, reference, run_dag

pytestmark = pytest.mark.e2e
ZONE = "us-central1-a"


@pytest.fixture
def stage_scenario(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """The stage tests' default scenario (3x faster), and us-central1-a selling v6e TPU VMs on Compute Engine
    (``request.param`` free chips, 8 unless a test says).

    A scenario of this module's own: the shipped default sells no Compute Engine TPUs, so every other test's
    decisions stay what they were."""
    chips = getattr(request, "param", 8)  # free v6e chips on Compute Engine; 8: one ct6e-standard-8t
    compute_tpus = {
        "tpu_machine_types": ["ct6e-standard-4t", "ct6e-standard-8t"],
        "capacity": {"tpu-v6e-slice": {"on_demand": chips, "spot": chips}},
    }
    return scenario.build(
        tmp_path / "compute-tpu.yaml", "default", scenario.FAST, {"zones": {ZONE: {"gpu": compute_tpus}}}
    )


def _watch_instances(cloud: dev.LocalCloud, seen: dict[str, dict[str, Any]], stop: threading.Event) -> None:
    """Keep the Compute Engine view (instances.get) of every VM the cloud holds while the run goes on."""
    while not stop.is_set():
        for m in dev.machines(cloud):
            if m["kind"] == "gce" and m["name"] not in seen:
                zone_url = f"{cloud.api_endpoint}/compute/v1/projects/{cloud.project}/zones/{m['zone']}"
                url = f"{zone_url}/instances/{m['name']}"
                try:
                    with urllib.request.urlopen(url, timeout=10) as answer:
                        seen[m["name"]] = json.loads(answer.read())
                except OSError:
                    pass  # deleted between the listing and the read: the next pass sees the next one
        stop.wait(0.5)


def test_v6e_on_a_compute_engine_tpu_machine_type_drills_in_both_stages(stage_stack, tmp_path: Path) -> None:
    cloud, _ = stage_stack
    seen: dict[str, dict[str, Any]] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_instances, args=(cloud, seen, stop), daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        result, run_key = run_dag(
            stage_stack, tmp_path, drill_maintenance=True, platforms=["compute"], tpu_types=["v6e-8"]
        )
    finally:
        stop.set()
        watcher.join(timeout=30)
    print(f"dags test took {time.monotonic() - started:.0f} s")
    assert result.succeeded, result.log[-4000:]

    # The cloud's own account: one Compute Engine instance of the TPU machine type, no Cloud TPU API call.
    (instance,) = seen.values()
    assert instance["machineType"].endswith("/machineTypes/ct6e-standard-8t"), instance["machineType"]
    assert "guestAccelerators" not in instance and instance["scheduling"]["onHostMaintenance"] == "TERMINATE"
    events = cloud.admin.events()
    assert not [e for e in events if e["event"].startswith(("tpu_", "queued_resource"))]
    assert boots(cloud, instance["name"]) == 3, "one boot, then one per drill"

    # The workload's own account of each drill, against the run report's.
    for event, held, resumed in drilled_stages(cloud, run_key).values():
        assert event["checkpoint_step"] == held[0] and event["resumed_from_step"] == held[0], (held, event)
        assert held[0] in resumed and event["steps_recomputed"] == 0, (held, resumed, event)

    assert final_digest(cloud, run_key) == reference(cloud)
    assert dev.machines(cloud) == []


def test_a_tpu_api_runtime_as_the_compute_engine_image_is_refused_before_anything_is_created(
    stage_stack,
    tmp_path: Path,
) -> None:
    """``tpu_image`` names a Cloud TPU API runtime version: the runtime check refuses it naming the param, the run
    fails and the cloud never saw a create (its own event log)."""
    cloud, _ = stage_stack
    result, _ = run_dag(
        stage_stack, tmp_path, platforms=["compute"], tpu_types=["v6e-8"], tpu_image="v2-alpha-tpuv6e", timeout=300
    )
    assert result.state == "failed", result.log[-3000:]
    assert "tpu_image / framework: NOT OK: v6e-8" in result.log
    assert "v2-alpha-tpuv6e is a Cloud TPU API runtime version" in result.log
    creates = {"gce_instance_insert", "tpu_node_create", "queued_resource_create", "machine_boot"}
    assert [e for e in cloud.admin.events() if e["event"] in creates] == []
    assert dev.machines(cloud) == []


@pytest.mark.parametrize("stage_scenario", [0], indirect=True, ids=["no-free-chip"])
def test_a_compute_engine_tpu_stockout_walks_to_the_next_platform(stage_stack, tmp_path: Path) -> None:
    """us-central1-a lists ct6e-standard-8t but has no v6e chip free: the insert stocks out (Google's
    ZONE_RESOURCE_POOL_EXHAUSTED, seen only at create), the stockout marks v6e-8 out on Compute Engine only, and the
    tree walks on to the run's next platform, the TPU API's v6e-8 node, where the run trains to the reference
    weights and leaves nothing."""
    cloud, _ = stage_stack
    conf = {"train_steps": 20, "finetune_steps": 10}
    result, run_key = run_dag(
        stage_stack, tmp_path, platforms=["compute", "tpu_api"], tpu_types=["v6e-8"], zones=[ZONE], **conf
    )
    assert result.succeeded, result.log[-4000:]
    events = cloud.admin.events()
    inserts = [e for e in events if e["event"] == "gce_instance_insert"]
    assert [(e["machine_type"], e["outcome"]) for e in inserts] == [
        ("ct6e-standard-8t", "ZONE_RESOURCE_POOL_EXHAUSTED")
    ]
    nodes = [e for e in events if e["event"] == "tpu_node_create"]
    assert len(nodes) == 1 and nodes[0]["node"].endswith(f"{run_key}-tpu"), nodes
    assert "not on compute: v6e-8 us-central1-a on compute (ct6e-standard-8t): stockout met earlier" in result.log
    assert final_digest(cloud, run_key) == reference(cloud, **conf)
    assert dev.machines(cloud) == []
