"""Issue 4's "must show", as real DAG runs: `airflow dags test` of the lifecycle DAG on the local cloud,
one scenario per test, judged by the task instance states Airflow stored and by what the local cloud holds.

What the `choose` group can see is what Google exposes: offered types, regional quotas, reservations,
queued resources. Stock is invisible until a create fails (see ``interlude.capacity.report``). So a scenario whose
shortage is *stock* (capacity 0 while the type is offered) is decided as available and then handled by
provisioning's stockout loop; a branch such as ``choose.smaller_gpu`` or ``choose.stuck`` is taken when the
shortage is *visible* (type not offered in the zones, quota exhausted). The tests below use variants of
the shipped scenarios with visible shortages for those branches, and the shipped stock-only scenario for
the stockout path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from interlude_dev import scenario

if TYPE_CHECKING:  # the fixtures' types; conftest is not importable as a module under importlib mode
    from tests.e2e.conftest import DagRunResult, RunDag

pytestmark = pytest.mark.e2e

AFTER_PLAN = ("provision", "train", "finetune_gate", "finetune", "run_report")


def scenario_variant(tmp_path: Path, base: str, edit: Callable[[dict[str, Any]], None]) -> Path:
    """A shipped scenario with ``edit`` applied, written under tmp_path (the shipped file stays as is)."""
    return scenario.build(tmp_path / f"{base}-variant.yaml", base, edit=edit)


def assert_branch(result: DagRunResult, leaf: str) -> None:
    """Exactly ``leaf`` ran in the choose group; every other leaf was skipped by the branch."""
    assert result.taken() == {f"choose.{leaf}"}, result.states
    for other in set(result.CHOOSE_LEAVES) - {leaf}:
        assert result.states[f"choose.{other}"] == "skipped", (other, result.states)


CREATE_EVENTS = {"tpu_node_create", "gce_instance_insert", "queued_resource_create", "machine_boot"}


def assert_nothing_created(result: DagRunResult) -> None:
    """No machine exists and none was even asked for (the local cloud logs every create attempt)."""
    assert result.machines() == []
    attempts = [e for e in result.events() if e.get("event") in CREATE_EVENTS]
    assert attempts == [], attempts


def test_tpu_plentiful_plan_only_takes_tpu_and_creates_nothing(run_dag: RunDag) -> None:
    result = run_dag("default", {"plan_only": True})

    assert (result.state, result.exit_code) == ("success", 0), result.log[-3000:]
    assert_branch(result, "tpu")
    assert result.states["choose.approve_convert_for_gpu"] == "skipped"
    assert result.states["validate_runtime"] == "success"
    assert result.states["continue_unless_plan_only"] == "success"
    # Teardown runs whatever happened upstream (all_done) and finds nothing of the run to delete.
    assert result.states["teardown"] == "success", result.states
    for task_id in AFTER_PLAN:
        assert result.states[task_id] == "skipped", (task_id, result.states)
    assert "Plan only: would provision v6e-8 in us-central1-a with runtime v2-alpha-tpuv6e" in result.log
    assert_nothing_created(result)


def test_tpu_short_gpu_free_takes_gpu(run_dag: RunDag) -> None:
    # us-central1-a offers no TPU at all in this scenario: the shortage is visible to the probe.
    result = run_dag("tpu_short_gpu_free", {"plan_only": True, "zones": ["us-central1-a"]})

    assert result.state == "success", result.log[-3000:]
    assert_branch(result, "gpu")
    assert "Plan only: would provision nvidia-h100-80gb in us-central1-a" in result.log
    assert_nothing_created(result)


def test_gpu_first_with_large_gpus_gone_takes_smaller_gpu(run_dag: RunDag, tmp_path: Path) -> None:
    def large_gpus_visibly_gone(raw: dict[str, Any]) -> None:
        gpu = raw["zones"]["us-central1-a"]["gpu"]
        # H100 has no regional on-demand quota metric, so only "not offered" is visible for it.
        gpu["accelerator_types"] = [t for t in gpu["accelerator_types"] if t != "nvidia-h100-80gb"]
        raw["regions"]["us-central1"]["quotas"]["NVIDIA_A100_80GB_GPUS"] = 0

    scenario = scenario_variant(tmp_path, "gpu_large_gone", large_gpus_visibly_gone)
    result = run_dag(scenario, {"plan_only": True, "strategy": "gpu_first", "zones": ["us-central1-a"]})

    assert result.state == "success", result.log[-3000:]
    assert_branch(result, "smaller_gpu")
    assert "Plan only: would provision nvidia-l4 in us-central1-a" in result.log
    assert_nothing_created(result)


def test_nothing_available_fails_stuck_with_report(run_dag: RunDag, tmp_path: Path) -> None:
    def nothing_visible(raw: dict[str, Any]) -> None:
        for zone in raw["zones"].values():
            zone.setdefault("tpu", {})["accelerator_types"] = []
            if "gpu" in zone:
                zone["gpu"]["accelerator_types"] = [
                    t for t in zone["gpu"]["accelerator_types"] if t != "nvidia-h100-80gb"
                ]
        for region in raw["regions"].values():
            region["quotas"] = {k: 0 for k in region["quotas"]}

    scenario = scenario_variant(tmp_path, "nothing_available", nothing_visible)
    # A GPU-only model whose profile allows no waiting: nothing to wait for, so the run is stuck.
    result = run_dag(scenario, {"model_profile": "cuda-kernels-gpu-only", "framework": "pytorch"})

    assert result.state == "failed"
    assert result.exit_code != 0
    assert_branch(result, "stuck")
    assert result.states["choose.stuck"] == "failed"
    assert result.states["validate_runtime"] == "upstream_failed"
    assert result.states["provision"] == "upstream_failed"
    for text in (
        "No accelerator can be had for this run.",
        "No accelerator for model 'cuda-kernels-gpu-only' (strategy tpu_first)",
        "May the run wait for capacity? -> no: the profile does not allow waiting",
        "Capacity seen per candidate:",
        "us-central1-a: not offered",
    ):
        assert text in result.log, text
    assert_nothing_created(result)


def test_wrong_tpu_runtime_fails_before_provisioning(run_dag: RunDag) -> None:
    # v2-alpha-tpuv5-lite is the v5e runtime; the tree chooses a v6e-8.
    result = run_dag("default", {"tpu_runtime_version": "v2-alpha-tpuv5-lite"})

    assert result.state == "failed"
    assert result.exit_code != 0
    assert_branch(result, "tpu")
    assert result.states["validate_runtime"] == "failed"
    assert result.states["provision"] in ("upstream_failed", "skipped"), result.states
    assert "NOT OK: v6e-8 (TPU v6e (Trillium)) with v2-alpha-tpuv5-lite" in result.log
    assert_nothing_created(result)


def test_nothing_in_stock_fails_in_provisioning_and_leaves_nothing(run_dag: RunDag) -> None:
    """The shipped scenario: everything offered, nothing in stock. The probe cannot see stock, so the tree
    picks a GPU; the create stocks out, the tree is walked again without it until nothing is left, and
    the run fails with the stockouts and the stuck report. No machine is left behind."""
    result = run_dag(
        "nothing_available",
        {"model_profile": "cuda-kernels-gpu-only", "framework": "pytorch", "zones": ["us-central1-a"]},
    )

    assert result.state == "failed"
    assert result.exit_code != 0
    assert_branch(result, "gpu")
    assert result.states["provision"] == "failed", result.states
    assert result.states["train"] == "upstream_failed", result.states
    assert "Out of capacity after stockouts" in result.log
    inserts = [e for e in result.events() if e.get("event") == "gce_instance_insert"]
    assert inserts and all(e["outcome"] != "ok" for e in inserts), inserts
    assert result.machines() == []


def test_tpu_only_model_without_tpus_converts_for_gpu_without_approval_by_default(run_dag: RunDag) -> None:
    """A TPU-only model, no TPU offered, GPUs free: the tree converts it for GPU (with the effort estimate
    in the log). `require_conversion_approval` defaults to false, so the approval task is skipped and the
    run goes on to validation: `dags test` never reaches the human-in-the-loop task."""
    result = run_dag(
        "tpu_short_gpu_free", {"plan_only": True, "zones": ["us-central1-a"], "model_profile": "maxtext-tpu-only"}
    )

    assert result.state == "success", result.log[-3000:]
    assert_branch(result, "convert_for_gpu")
    assert "Conversion for gpu: 10 person-days; swap Pallas TPU kernels" in result.log
    assert result.states["choose.convert_for_gpu_needs_approval"] == "success"
    assert result.states["choose.approve_convert_for_gpu"] == "skipped"
    assert result.states["choose.approve_convert_for_tpu"] == "skipped"
    assert result.states["validate_runtime"] == "success"
    assert "Plan only: would provision nvidia-h100-80gb in us-central1-a" in result.log
    assert_nothing_created(result)


def test_bad_input_fails_the_first_task_naming_the_params(run_dag: RunDag) -> None:
    """Refused in resolve_run, before any cloud call that creates; the failure message talks about params."""
    result = run_dag(
        "default",
        {"bucket": "--help", "network": "vpc\nINFO forged log line", "zones": ["mars-north1-z"]},
        ensure_bucket=False,
    )

    assert result.state == "failed", result.log[-3000:]
    assert result.states["resolve_run"] == "failed", result.states
    for task_id, state in result.states.items():
        if task_id != "resolve_run":
            assert state not in ("success", "running", "deferred"), (task_id, state)
    assert "bucket: '--help' is not a valid bucket name" in result.log
    assert "network: control characters are not allowed" in result.log
    # The forged line never reaches the log as a line of its own.
    assert "\nINFO forged log line" not in result.log
    # The failure callback speaks of params, not machines.
    assert "Bad input:" in result.log and "Fix the param(s) named above" in result.log
    assert "provisioned again" not in result.log
    start = result.log.index("Interlude: step 'resolve_run' failed")
    callback = result.log[start : result.log.index("clearing this step would fail the same way", start)]
    assert "machine" not in callback.lower() and "resume" not in callback.lower(), callback
    assert_nothing_created(result)


def test_unknown_zone_and_missing_bucket_are_refused_by_the_cloud_checks(run_dag: RunDag) -> None:
    result = run_dag(
        "default", {"bucket": "no-such-bucket-here", "zones": ["mars-north1-z", "us-central1-a"]}, ensure_bucket=False
    )

    assert result.states["resolve_run"] == "failed", result.states
    assert "zones: 'mars-north1-z' does not exist for this project" in result.log
    assert "bucket: gs://no-such-bucket-here does not exist" in result.log
    assert_nothing_created(result)


def test_a_run_dated_outside_the_shipped_sample_finds_its_data_slice(run_dag: RunDag) -> None:
    """A scheduled run today (no data_date) gets a generated slice for its own date instead of failing."""
    result = run_dag("default", {"plan_only": True, "data_date": None})

    assert result.state == "success", result.log[-3000:]
    assert result.states["resolve_run"] == "success"
