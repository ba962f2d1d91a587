"""The pool cap's last create path: a stage re-creating its machine after its run's teardown released the
machine slot (the stage cleared on its own) takes a slot first, and waits while every slot is held.

Real pieces: the local cloud (TPU API, GCS with write preconditions), the stage operator's own
re-provision. The fact asserted is the cloud's machine list and the slot objects in GCS.
"""

from __future__ import annotations

import time

import pytest

from interlude import naming
from interlude_dev import wiring as dev
from tests.faults.support import BASE, BUCKET, DAG_ID, ZONES

pytestmark = pytest.mark.e2e


def _run_machines(cloud: dev.LocalCloud, key: str) -> list[str]:
    return [m["name"] for m in cloud.admin.machines() if key in m["name"]]


def test_a_stage_recreating_its_machine_after_teardown_takes_a_slot_first(
    cloud: dev.LocalCloud, airflow_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from interlude.machines import slots as machine_slots
    from interlude.operators.stage import TrainingStageOperator
    from interlude.operators.stage_actions import CapacityWait
    from interlude.training import tasks as lifecycle
    from interlude.training.spec import RunSpec

    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", airflow_env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
    monkeypatch.setenv("AIRFLOW__INTERLUDE__MAX_MACHINES", "1")
    run_id = f"slot-{time.time_ns()}"
    key = naming.run_key(DAG_ID, run_id)
    spec = RunSpec.from_params({**BASE, "zones": list(ZONES)}, dag_id=DAG_ID, run_id=run_id, run_key=key)
    decision = {"kind": "tpu", "zone": ZONES[1], "accelerator_type": "v6e-8", "mode": "on_demand", "leaf": "tpu"}
    machine = lifecycle.provision(spec, {"decision": decision, "runtime": "v2-alpha-tpuv6e"}, {"zones": []})
    assert _run_machines(cloud, key) == [machine["name"]]
    assert [s.run_key for s in machine_slots.holders(BUCKET)] == [key]
    lifecycle.teardown(spec)  # the run ended: machine deleted, slot released
    assert machine_slots.holders(BUCKET) == []

    other = "another-run-holding-the-only-slot"
    assert machine_slots.take(BUCKET, other, DAG_ID, other, cap=1) == 0
    stage = TrainingStageOperator(task_id="finetune", machine=machine, spec=spec.to_dict(), stage="finetune", order=2)
    try:
        with pytest.raises(CapacityWait, match=r"max_machines.*another-run-holding-the-only-slot"):
            stage._reprovision()  # the cleared stage finds its machine gone: all slots held, no create
        assert _run_machines(cloud, key) == []

        machine_slots.release(BUCKET, other)
        stage._reprovision()
        assert _run_machines(cloud, key) == [machine["name"]]
        assert [s.run_key for s in machine_slots.holders(BUCKET)] == [key]
    finally:
        machine_slots.release(BUCKET, other)
        lifecycle.teardown(spec)
    assert _run_machines(cloud, key) == [] and machine_slots.holders(BUCKET) == []
