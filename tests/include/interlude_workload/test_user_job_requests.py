"""A control request the last boot could not answer is answered at the next boot by the step the job left, without
stopping the job again (interlude_workload.job.UserJob).

Why: the control plane may ask for a checkpoint just before the window opens, while the workload already holds at
its committed step; the machine goes down before the hold answers. On the next boot the job has run nothing yet, so
the step it left is its state: stopping the freshly started job for a maintenance already past (what the UserJob
did, found by a full CI run) costs a restart and reads as a second hold. Checked from the store (the ack and its
step) and the UserJob's own log, with a real job process and the GCS emulator.
"""

from __future__ import annotations

import sys

from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.job import UserJob
from interlude_workload.plan import StagePlan

RUN = "stale-request"


def test_a_request_from_before_this_boot_is_answered_and_the_job_runs_on(bucket: str, capsys) -> None:  # type: ignore[no-untyped-def]
    store = CheckpointStore(bucket, RUN, "train")
    store.request_checkpoint("0123456789ab", "maintenance notice")
    job_seconds = 1.5  # long enough for several of the UserJob's polls: a stop would come within the first
    plan = StagePlan(
        order=1,
        stage="train",
        steps=5,
        checkpoint_every=1,
        seed=0,
        command=[sys.executable, "-c", f"import time; time.sleep({job_seconds}); print('job ran to its end')"],
    )
    job = UserJob(plan, bucket, RUN, poll=0.05)
    job.wait()
    log = capsys.readouterr().out
    assert store.pending_requests() == []
    assert store.checkpoint_for_request("0123456789ab") is not None
    assert "job ran to its end" in log and "job exited 0" in log, log
    assert "holding" not in log and "SIGTERM" not in log, log
    assert "control request 0123456789ab (from before this boot) answered with committed step 0" in log
