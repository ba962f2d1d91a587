"""The drill hold: the trainer commits the drill step, holds there, answers requests with it, and (when no
maintenance comes) trains on to the same weights as an uninterrupted run."""

from __future__ import annotations

from pathlib import Path

from interlude_workload.checkpoints import CheckpointStore

from .trainer_proc import digest_of, run_trainer, start_trainer, trainer_cmd, wait_for_text


def test_holds_at_the_drill_step_answers_requests_with_it_and_loses_nothing(bucket: str, tmp_path: Path) -> None:
    reference = run_trainer(trainer_cmd(bucket, "reference", steps=20, every=20))
    assert reference.returncode == 0, reference.stdout + reference.stderr
    log = tmp_path / "trainer.log"
    cmd = trainer_cmd(bucket, "drill", "--hold-at-step", "5", "--max-hold-seconds", "4", steps=20, every=10)
    proc = start_trainer(cmd, log)
    try:
        assert wait_for_text(log, "holding at committed step 5: drill step 5", proc)
        store = CheckpointStore(bucket, "drill", "train")
        assert store.latest().checkpoint.step == 5, "the held step is committed before holding"
        store.request_checkpoint("req1", "maintenance notice")
        assert wait_for_text(log, "control request req1 answered with held step 5", proc)
        assert store.checkpoint_for_request("req1") == 5
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "hold released: held 4s and the machine is still up" in text
    assert digest_of(text) == digest_of(reference.stdout)
