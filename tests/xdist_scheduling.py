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

STACK_FILES = ("tests/e2e/test_stack.py", "tests/e2e/test_zz_browser.py", "tests/e2e/test_zz_schedule.py")
PER_TEST_DIRS = ("tests/e2e/", "tests/faults/", "tests/benchmarks/", "tests/include/scripts/")
WHOLE_FILES = ("tests/e2e/test_serving_dag.py", "tests/faults/test_provision_defers.py")  # module-scoped clouds
DEFAULT_STACK_SHARDS = 2
UNKNOWN_TEST_SECONDS = 60.0
# Seconds per stack test in a `make test` on the loaded 2-core machine (pytest's slowest-durations list):
# only used to balance the shards, so rough figures are enough.
STACK_TEST_SECONDS = {
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


# The longest units besides the stack (seconds in a `make test` on the loaded machine; rough is enough).
LONG_UNITS = {
    "tests/e2e/test_serving_dag.py": 340.0,
    "tests/faults/test_notice_policy.py::test_long_notice_trains_on_commits_before_the_window_and_idles_less_than_"
    "checkpoint_at_notice": 300.0,
    "tests/include/scripts/test_demo_serve.py::test_demo_serve_falls_back_scales_out_survives_maintenance_and_"
    "leaves_nothing": 295.0,
    "tests/benchmarks/test_badput_smoke.py::test_three_rows_uninterrupted_interlude_and_naive": 265.0,
    "tests/faults/test_stage_watchdog.py::test_a_stalled_workload_is_restarted_once_then_the_stage_fails_with_the_"
    "log_tail": 230.0,
    "tests/e2e/test_lifecycle_runs.py::test_queued_resource_provisioning_for_a_profile_that_prefers_it": 200.0,
    "tests/faults/test_sweeper_dag.py::test_sweeper_deletes_a_finished_runs_orphan_and_keeps_a_running_runs_"
    "machine": 180.0,
    "tests/faults/test_stage_drills.py::test_non_deferrable_stages_drill_and_finish_with_the_reference_weights": 165.0,
    "tests/benchmarks/test_triggerer_watch_smoke.py::test_twenty_triggers_poll_in_a_real_triggerer_floor_before_"
    "after_and_a_git_ref": 150.0,
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
