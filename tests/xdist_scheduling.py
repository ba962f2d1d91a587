"""How `make test` spreads the suite over pytest-xdist workers: which tests must run together, and in what order.

xdist's own `--dist loadgroup` reads `xdist_group` marks and tags each node id with its group on the worker
(`item._nodeid = ...@group`); pytest 9.2 keeps node ids elsewhere, so the tag is silently lost and every test
became its own unit: the stack's tests spread over all workers (each worker started a stack of its own) and
files with module fixtures were split. The grouping is decided here instead, from node ids alone, by the
controller's scheduler (`pytest_xdist_make_scheduler`, xdist's public hook), so it cannot be lost that way:

- the production-shaped stack's tests (STACK_FILES) are split into `TEST_STACK_SHARDS` shards (default 2),
  each run whole on one worker against one stack, balanced by how long each test took in a recent
  `make test` (STACK_TEST_SECONDS; unknown tests count as 60 s). They are queued first: they are the
  longest chains;
- end-to-end, fault, benchmark-smoke and script tests (PER_TEST_DIRS) start their own Airflow and local
  cloud per test: each is a unit of its own, so the long ones overlap; except WHOLE_FILES (module-scoped
  clouds);
- every other file is one unit (its module-scoped fixtures are built once).

Work units are handed out longest first (the stack's shards, then LONG_UNITS, then the rest in collection
order), not in xdist's "most tests first" order, which would queue a 500-case unit-test file before the
stack, and not alphabetically, which would start a five-minute test in the last minutes of the run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from xdist.scheduler.loadscope import LoadScopeScheduling

STACK_FILES = (
    "tests/e2e/test_stack.py",
    "tests/e2e/test_zz_browser.py",
    "tests/e2e/test_zz_interlude_view.py",
    "tests/e2e/test_zz_schedule.py",
)
PER_TEST_DIRS = ("tests/e2e/", "tests/faults/", "tests/benchmarks/", "tests/include/scripts/")
WHOLE_FILES = ("tests/e2e/test_serving_dag.py", "tests/faults/test_provision_defers.py")  # module-scoped clouds
DEFAULT_STACK_SHARDS = 2
UNKNOWN_TEST_SECONDS = 60.0
# Seconds per stack test in a `make test` on the loaded 2-core machine (pytest's slowest-durations list):
# only used to balance the shards, so rough figures are enough.
STACK_TEST_SECONDS = {
    "test_after_two_maintenance_events_and_a_failover_the_three_pages_tell_the_story": 240.0,
    "test_a_serving_run_with_a_fallback_and_a_drained_node_in_the_interlude_view": 150.0,
    "test_no_session_gets_401_and_a_user_without_a_role_403_on_every_page": 15.0,
    "test_machines_alive_at_once_never_exceed_the_accelerator_pool": 190.0,
    "test_killed_training_task_cleared_resumes_from_checkpoint": 160.0,
    "test_triggerer_restart_during_training_still_handles_maintenance": 150.0,
    "test_trigger_form_with_a_drill_runs_to_success_and_the_ui_tells_the_truth": 150.0,
    "test_backfill_three_dates_gives_three_runs": 130.0,
    "test_triggered_run_succeeds_on_celery_with_trigger_in_triggerer": 115.0,
    "test_a_bad_param_typed_in_the_form_fails_the_first_task_whose_log_names_it": 100.0,
    "test_conversion_approval_given_through_the_rest_api": 70.0,
    "test_unpaused_schedule_runs_the_latest_interval_and_every_scheduled_run_succeeds": 60.0,
    "test_component_logs_show_no_insecure_key_and_no_cold_first_task_start": 5.0,
    "test_no_file_of_the_running_stack_shows_a_secret_to_others": 5.0,
}


# The longest units besides the stack (seconds each took in a six-worker run on the loaded machine, 2026-12-05,
# rounded; rough is enough): handed out first, longest first, so no long unit starts in the last minutes.
LONG_UNITS = {
    "tests/benchmarks/test_triggerer_watch_smoke.py::test_twenty_triggers_poll_in_a_real_triggerer_floor_before"
    "_after_and_a_git_ref": 175.0,
    "tests/include/scripts/test_demo_serve.py::test_demo_serve_falls_back_scales_out_survives_maintenance_and_leaves"
    "_nothing": 165.0,
    "tests/faults/test_notice_policy.py::test_long_notice_trains_on_commits_before_the_window_and_starts_it_early"
    "_unlike_checkpoint_at_notice": 85.0,
    "tests/faults/test_stage_watchdog.py::test_a_stalled_workload_is_restarted_once_then_the_stage_fails_with_the"
    "_log_tail": 80.0,
    "tests/e2e/test_serving_dag.py": 80.0,
    "tests/benchmarks/test_badput_smoke.py::test_three_rows_uninterrupted_interlude_and_naive": 75.0,
    "tests/benchmarks/test_triggerer_watch_smoke.py::test_training_stages_rewriting_their_progress_cost_the_shared"
    "_design_no_download": 75.0,
    "tests/e2e/test_serving_maintenance.py::test_a_tpu_node_maintenance_under_load_loses_no_request": 75.0,
    "tests/e2e/test_warm_dags_test.py::test_a_warm_dags_test_runs_as_a_new_process_does": 65.0,
    "tests/faults/test_failover.py::test_nowhere_to_go_waits_for_capacity_when_the_profile_allows_then_resumes": 60.0,
    "tests/include/interlude_workload/test_agent.py": 60.0,
    "tests/benchmarks/test_dags_test_cost_smoke.py::test_one_cold_and_one_warm_plan_only_run_side_by_side": 55.0,
    "tests/faults/test_stage_watchdog.py::test_a_startup_script_that_ended_is_seen_restarted_once_then"
    "_fails[maxtext-tpu-only-guest attributes (interlude/startup) tail]": 55.0,
    "tests/faults/test_failover.py::test_all_tpu_capacity_gone_continues_on_gpu_from_the_tpu_checkpoint": 50.0,
    "tests/faults/test_failover.py::test_stockout_where_it_ran_moves_the_run_to_another_zone": 50.0,
    "tests/interlude_dev/test_warm_cli.py": 50.0,
    "tests/faults/test_stage_watchdog.py::test_api_outage_longer_than_the_hooks_retries_is_ridden_out": 50.0,
    "tests/e2e/test_lifecycle_runs.py::test_scheduled_maintenance_in_both_stages_loses_nothing": 45.0,
    "tests/faults/test_stage_drills.py::test_non_deferrable_stages_drill_and_finish_with_the_reference_weights": 45.0,
    "tests/faults/test_stage_watchdog.py::test_a_startup_script_that_ended_is_seen_restarted_once_then"
    "_fails[cuda-kernels-gpu-only-serial console tail]": 45.0,
    "tests/include/interlude_localcloud/gke/test_runtime.py": 45.0,
    "tests/faults/test_down_budget.py::test_a_gpu_vm_in_a_long_normal_maintenance_is_waited_for_not_recreated": 40.0,
    "tests/e2e/test_serving_stockout.py::test_with_gkes_tpu_delay_interludes_fallback_has_a_gpu_replica_ready_within"
    "_minutes": 35.0,
    "tests/benchmarks/test_triggerer_watch_smoke.py::test_a_sigterm_mid_run_stops_everything_the_benchmark"
    "_started": 35.0,
    "tests/e2e/test_lifecycle_runs.py::test_crash_without_notice_resumes_from_the_last_periodic_checkpoint": 35.0,
    "tests/faults/test_stage_drills.py::test_drill_in_both_stages_records_the_held_step_and_a_real_downtime": 35.0,
    "tests/faults/test_down_budget.py::test_a_gpu_vm_google_reports_gone_is_reprovisioned_without_waiting_the"
    "_budget": 35.0,
    "tests/faults/test_provision_defers.py": 30.0,
    "tests/include/interlude_localcloud/test_maintenance.py": 30.0,
    # From `make test-quick` runs (three workers, load 10-12): collected late, these files ran on past the others.
    "tests/plugins/interlude/triggers/test_checkpoint_trigger.py": 70.0,
    "tests/plugins/interlude/stage/test_facts.py": 35.0,
    "tests/plugins/interlude/triggers/test_stage_trigger_notice.py": 30.0,
}


def path_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def is_stack_test(nodeid: str) -> bool:
    return path_of(nodeid) in STACK_FILES


def stack_shards() -> int:
    """`TEST_STACK_SHARDS` from the environment: how many stacks (and workers) the stack's tests use."""
    value = os.environ.get("TEST_STACK_SHARDS", "")
    return max(1, int(value)) if value.strip() else DEFAULT_STACK_SHARDS


def plan_stack_shards(nodeids: Sequence[str], shards: int) -> dict[str, int]:
    """Each stack test's shard: longest first onto the least-loaded shard (ties: the lower shard), so the
    shards end close together. A shard keeps its tests in collection order when it runs."""
    seconds = {nodeid: STACK_TEST_SECONDS.get(nodeid.split("::")[-1], UNKNOWN_TEST_SECONDS) for nodeid in nodeids}
    load = [0.0] * max(1, shards)
    plan: dict[str, int] = {}
    for nodeid in sorted(nodeids, key=lambda n: (-seconds[n], nodeids.index(n))):
        shard = min(range(len(load)), key=lambda i: (load[i], i))
        plan[nodeid] = shard
        load[shard] += seconds[nodeid]
    return plan


def unit_of(nodeid: str, stack_plan: dict[str, int]) -> str:
    """The work unit a test runs in: one worker runs a unit whole, in collection order."""
    path = path_of(nodeid)
    if nodeid in stack_plan:
        return f"stack-{stack_plan[nodeid]}"
    if path.startswith(PER_TEST_DIRS) and path not in WHOLE_FILES:
        return nodeid
    return path


def run_order(nodeids: Sequence[str], stack_plan: dict[str, int]) -> list[str]:
    """The order units are handed out in: the stack's shards, then LONG_UNITS longest first, then the rest as
    collected; each unit's tests stay together, in collection order."""
    position = {nodeid: i for i, nodeid in enumerate(nodeids)}

    def key(nodeid: str) -> tuple[int, float, int]:
        unit = unit_of(nodeid, stack_plan)
        return (0 if nodeid in stack_plan else 1, -LONG_UNITS.get(unit, 0.0), position[nodeid])

    return sorted(nodeids, key=key)


class GroupedScheduling(LoadScopeScheduling):
    """xdist's load-by-scope scheduler with this suite's units (`unit_of`), handed out in `run_order`."""

    _stack_plan: dict[str, int] | None = None

    def schedule(self) -> None:
        """LoadScopeScheduling.schedule (xdist 3.8) with the work queue in `run_order`. Workers keep their own
        collections (test indices are theirs); only the order units are queued in changes."""
        assert self.collection_is_completed
        if self.collection is not None:  # the initial distribution happened: reschedule, as the base does
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        collected = list(next(iter(self.registered_collections.values())))
        self.collection = collected
        if collected:
            self._distribute(collected)

    def _distribute(self, collected: list[str]) -> None:
        self._stack_plan = plan_stack_shards([n for n in collected if is_stack_test(n)], stack_shards())
        for nodeid in run_order(collected, self._stack_plan):
            self.workqueue.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than units
            unused_node, _assigned = self.assigned_work.popitem()
            unused_node.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:  # each starts with two units where there are enough (xdist #277)
            self._reschedule(node)
        if not self.workqueue:  # everything was sent: the workers stop after it
            for node in self.nodes:
                node.shutdown()

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid, self._stack_plan or {})
