"""A GPU VM's hour of maintenance notice is training time (issue 15: maintenance policy by notice length).

The same lifecycle run twice on the real local cloud, each getting a SCHEDULED host maintenance an hour
ahead (6 s at 600x) at step 20 of training: once with the policy (``by_notice``), once the old way
(``checkpoint_at_notice``). The facts are the workload's own log (when it saw the notice, when it stopped
stepping, what it committed, where the new boot resumed) and the local cloud's own record of when the
maintenance started; the final weights are checked against an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlude import dev

from .notice_runs import CONF, GPU_NOTICE_S, TIME_SCALE, run_with_notice, write_scenario
from .stage_fixtures import BASE, BUCKET, final_digest, stage_airflow_db, stage_stack  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e
NOTICE_REAL_S = GPU_NOTICE_S / TIME_SCALE


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    """Overrides stage_fixtures' scenario: GPU notice an hour (6 s), host maintenance 5 minutes (0.5 s)."""
    return write_scenario(tmp_path / "notice.yaml")


def test_long_notice_trains_on_commits_before_the_window_and_idles_less_than_checkpoint_at_notice(
    stage_stack,  # noqa: F811
    tmp_path: Path,
) -> None:
    cloud, env = stage_stack
    (tmp_path / "policy").mkdir()
    (tmp_path / "old").mkdir()
    result, run_key, policy = run_with_notice(cloud, env, BUCKET, "by_notice", tmp_path / "policy" / "dags.log")
    assert result.succeeded, result.log[-4000:]
    assert policy is not None, "the notice never came"
    assert final_digest(cloud, run_key) == dev.reference_digest(cloud, BUCKET, {**BASE, **CONF})
    old_result, _, old = run_with_notice(cloud, env, BUCKET, "checkpoint_at_notice", tmp_path / "old" / "dags.log")
    assert old_result.succeeded, old_result.log[-4000:]
    assert old is not None, "the notice never came"
    print(json.dumps({"by_notice": policy.to_dict(), "checkpoint_at_notice": old.to_dict()}, indent=1))

    # Kept training through most of the notice, past the step it was at when the notice came.
    assert policy.stopped_step > policy.notice_step + 10, policy
    assert policy.trained_after_notice_s > NOTICE_REAL_S / 2, policy
    # ... and the checkpoint it resumed from, or the one the plan asked for, committed before the window.
    assert 0 < policy.committed_before_window_s < NOTICE_REAL_S / 2, policy
    assert policy.last_commit_before_window > policy.notice_step and policy.recomputed_steps == 0, policy
    assert policy.resume_step >= policy.last_commit_before_window, policy
    # The old way stopped stepping at once and held through the notice.
    assert old.trained_after_notice_s < NOTICE_REAL_S / 2, old
    # Less idle: seconds of the notice that the old way spent holding (a loaded machine slows both alike).
    assert policy.idle_s + 2.0 < old.idle_s, (policy, old)
    assert policy.lost_s < old.lost_s, (policy, old)
    assert "performMaintenance" in result.log or "holding at committed step" in result.log
    assert dev.machines(cloud) == []
