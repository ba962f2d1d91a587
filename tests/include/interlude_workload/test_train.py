"""The reference trainer as real processes: kills and resumes give bit-identical final weights."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from interlude_workload.checkpoints import COMMIT_SUCCESS, CheckpointStore

from .trainer_proc import digest_of, run_trainer, start_trainer, trainer_cmd, wait_for_text

STEPS = 60


def _reference_digest(bucket: str, steps: int = STEPS, seed: int = 7) -> str:
    """Uninterrupted, checkpointing only at the end: the truth interrupted runs must reproduce."""
    done = run_trainer(trainer_cmd(bucket, "reference", steps=steps, every=steps, seed=seed))
    assert done.returncode == 0, done.stderr + done.stdout
    return digest_of(done.stdout)


def _kill_and_resume(
    bucket: str, run_key: str, log: Path, sig: signal.Signals, rng: random.Random, kills: int
) -> tuple[int, list[int]]:
    """Start, kill at a random moment of training, restart; repeat; then let it finish."""
    codes: list[int] = []
    cmd = trainer_cmd(bucket, run_key, "--step-seconds", "0.02", steps=STEPS, every=7)
    for _ in range(kills):
        mark = log.stat().st_size if log.exists() else 0
        proc = start_trainer(cmd, log)
        try:
            # After this boot's first commit (the first step compiles first): a kill then lands mid-training with
            # a resume point behind it.
            if wait_for_text(log, "committed in", proc, start_at=mark) and proc.poll() is None:
                time.sleep(rng.uniform(0.0, 0.6))
                proc.send_signal(sig)
            codes.append(proc.wait(timeout=120))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    final = start_trainer(cmd, log)
    return final.wait(timeout=240), codes


def test_uninterrupted_run_is_deterministic_and_final_is_committed(bucket: str) -> None:
    first = _reference_digest(bucket)
    again = run_trainer(trainer_cmd(bucket, "second", steps=STEPS, every=9))
    assert again.returncode == 0 and digest_of(again.stdout) == first  # checkpoint cadence changes nothing
    latest = CheckpointStore(bucket, "second", "train").latest(verify="full").checkpoint
    assert latest is not None and latest.step == STEPS and latest.extra["weights_sha256"] == first
    other_seed = run_trainer(trainer_cmd(bucket, "third", steps=STEPS, every=STEPS, seed=8))
    assert digest_of(other_seed.stdout) != first


def test_sigkill_at_random_points_then_resume_is_bit_identical(bucket: str, tmp_path: Path) -> None:
    reference = _reference_digest(bucket)
    log = tmp_path / "trainer.log"
    code, codes = _kill_and_resume(bucket, "killed", log, signal.SIGKILL, random.Random(1234), kills=3)
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert codes.count(-signal.SIGKILL) >= 2, codes  # really killed mid-run
    assert output.count("resume point: step") >= 2
    assert digest_of(output) == reference


def test_sigterm_commits_current_step_and_resume_is_bit_identical(bucket: str, tmp_path: Path) -> None:
    reference = _reference_digest(bucket)
    log = tmp_path / "trainer.log"
    code, codes = _kill_and_resume(bucket, "termed", log, signal.SIGTERM, random.Random(99), kills=2)
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert 143 in codes, codes
    assert "stopped by SIGTERM after committing step" in output
    stopped_steps = [
        int(line.rsplit(" ", 1)[1])
        for line in output.splitlines()
        if "stopped by SIGTERM after committing step" in line
    ]
    resumed = [
        int(line.split("resume point: step ")[1].split()[0])
        for line in output.splitlines()
        if "resume point: step" in line
    ]
    assert resumed[: len(stopped_steps)] == stopped_steps  # zero steps recomputed after SIGTERM
    assert digest_of(output) == reference


# A trainer whose own SIGTERM arrives at one exact point: just after the SDK decided what step 5 needs
# (nothing: it is not a checkpoint step), or just as the loop asks whether to hold. The signal is real (os.kill
# of the trainer itself); only its moment is chosen, where a service manager's could land by chance.
_SIGTERM_AT = """
import os, signal, sys
from interlude_workload import sdk, train
original = getattr(sdk.Checkpointer, {method!r})
calls = []
def at_step_5(self, *args, **kwargs):  # both are called once a step, from step 1 on
    result = original(self, *args, **kwargs)
    calls.append(1)
    if len(calls) == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    return result
setattr(sdk.Checkpointer, {method!r}, at_step_5)
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parametrize("method", ["step_finished", "wait_while_held"])
def test_a_sigterm_after_the_commit_decision_still_commits_the_step_it_stops_at(bucket: str, method: str) -> None:
    cmd = trainer_cmd(bucket, f"late-{method}", steps=STEPS, every=50)
    cmd[1:3] = ["-c", _SIGTERM_AT.format(method=method)]
    done = run_trainer(cmd)
    assert done.returncode == 143, done.stdout + done.stderr
    assert "stopped by SIGTERM after committing step 5" in done.stdout, done.stdout
    latest = CheckpointStore(bucket, f"late-{method}", "train").latest(verify="full").checkpoint
    assert latest is not None and latest.step == 5, latest


def test_uncommitted_and_corrupt_checkpoints_are_never_resumed(bucket: str) -> None:
    reference = _reference_digest(bucket)
    first = run_trainer(trainer_cmd(bucket, "tamper", steps=30, every=10))
    assert first.returncode == 0
    store = CheckpointStore(bucket, "tamper", "train")
    # Step 30 (final) loses Orbax's commit marker (a save cut short); step 20's array bytes are damaged (every
    # data file of its array store: same sizes, other bytes), which only the restore can see.
    store.bucket.blob(store.step_prefix(30) + COMMIT_SUCCESS).delete()
    for blob in store.client.list_blobs(bucket, prefix=store.step_prefix(20) + "state/d/"):
        blob.upload_from_string(bytes(reversed(blob.download_as_bytes())))
    resumed = run_trainer(trainer_cmd(bucket, "tamper", steps=STEPS, every=10))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "skipped train step 30: not finalised by Orbax" in resumed.stdout
    assert "skipped train step 20: " in resumed.stdout and "Orbax cannot restore it" in resumed.stdout
    assert "resume point: step 10" in resumed.stdout
    assert "checkpoint step 20 committed" in resumed.stdout  # the bad step is saved again, not kept
    assert digest_of(resumed.stdout) == reference
    assert store.latest(verify="full").checkpoint.step == STEPS


def test_committed_final_step_exits_at_once_and_fresh_token_restarts_once(bucket: str) -> None:
    done = run_trainer(trainer_cmd(bucket, "again", steps=20, every=10))
    digest = digest_of(done.stdout)
    finished = CheckpointStore(bucket, "again", "train").read_progress()
    rerun = run_trainer(trainer_cmd(bucket, "again", steps=20, every=10))
    assert rerun.returncode == 0 and "already committed; nothing to do" in rerun.stdout
    assert digest_of(rerun.stdout) == digest and "checkpoint step" not in rerun.stdout
    # The boot that finished the stage keeps its record (when it finished, its step time: the run report's
    # figures); a later boot walking past the finished stage changes nothing in it.
    assert finished and finished["state"] == "done" and finished["mean_step_seconds"]
    assert CheckpointStore(bucket, "again", "train").read_progress() == finished
    fresh = run_trainer(trainer_cmd(bucket, "again", "--fresh", "try-2", steps=20, every=10))
    assert "start fresh (token try-2)" in fresh.stdout and "checkpoint step 10 committed" in fresh.stdout
    assert digest_of(fresh.stdout) == digest
    reboot = run_trainer(trainer_cmd(bucket, "again", "--fresh", "try-2", steps=20, every=10))
    assert "already applied" in reboot.stdout and "nothing to do" in reboot.stdout


def test_finetune_starts_from_train_and_uses_its_date_slice(bucket: str) -> None:
    assert run_trainer(trainer_cmd(bucket, "ft", steps=20, every=10)).returncode == 0
    digests = []
    for day in ("2024-01-05", "2024-02-20"):
        out = run_trainer(
            trainer_cmd(bucket, f"ft-{day[5:7]}", "--init-from-stage", "train", stage="finetune", steps=10, every=5)
        )
        assert out.returncode == 2 and "no committed checkpoint in stage train" in out.stdout
        ft = run_trainer(
            trainer_cmd(
                bucket,
                "ft",
                "--init-from-stage",
                "train",
                "--data-date",
                day,
                "--fresh",
                day,
                stage="finetune",
                steps=10,
                every=5,
            )
        )
        assert ft.returncode == 0, ft.stdout + ft.stderr
        assert "latest of stage train: step 20" in ft.stdout and f"tokens dated {day}" in ft.stdout
        digests.append(digest_of(ft.stdout))
        assert f"export gs://{bucket}/interlude/ft/finetune/export (6 files) written and verified" in ft.stdout
        # ... after the final step is committed: an export that fails costs no training
        assert ft.stdout.index("checkpoint step 10 committed") < ft.stdout.index("export gs://"), ft.stdout
    assert digests[0] != digests[1]


def test_a_day_missing_from_a_real_dataset_is_a_usage_error(bucket: str, tmp_path) -> None:
    """Only the shipped sample generates days; a user's own data never gets made-up text."""
    from interlude_workload.llm import corpus

    (tmp_path / "corpus.txt").write_text(corpus.load_corpus())
    (tmp_path / "finetune").mkdir()
    (tmp_path / "finetune" / "2024-01-05.txt").write_text(corpus.finetune_text("2024-01-05"))
    assert run_trainer(trainer_cmd(bucket, "real", "--data-dir", str(tmp_path), steps=10, every=5)).returncode == 0

    def finetune(day: str, *extra: str) -> Any:
        return run_trainer(
            trainer_cmd(
                bucket,
                "real",
                *extra,
                "--init-from-stage",
                "train",
                "--data-date",
                day,
                "--fresh",
                day,
                "--export",
                "no",
                stage="finetune",
                steps=5,
            )
        )

    ok = finetune("2024-01-05", "--data-dir", str(tmp_path))
    assert ok.returncode == 0 and "tokens dated 2024-01-05" in ok.stdout, ok.stdout + ok.stderr
    bad = finetune("1999-01-01", "--data-dir", str(tmp_path))
    assert bad.returncode == 2 and "no finetune/1999-01-01.txt" in bad.stderr, bad.stdout + bad.stderr
    made_up = finetune("1999-01-01")
    assert made_up.returncode == 0 and "tokens dated 1999-01-01" in made_up.stdout, made_up.stdout + made_up.stderr


def test_async_periodic_saves_resume_bit_identically(bucket: str) -> None:
    """Orbax's background saves for the periodic checkpoints: the same final weights, every periodic step finalised."""
    reference = _reference_digest(bucket, steps=30)
    first = run_trainer(trainer_cmd(bucket, "async", "--async-saves", steps=20, every=5))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "committed in the background" in first.stdout
    steps = [s.step for s in CheckpointStore(bucket, "async", "train").list() if s.committed]
    assert steps[-1] == 20 and len(steps) == 3  # retention keeps 3 of 5, 10, 15, 20 (all finalised)
    more = run_trainer(trainer_cmd(bucket, "async", "--async-saves", steps=30, every=5))
    assert more.returncode == 0 and "resume point: step 20" in more.stdout, more.stdout + more.stderr
    assert digest_of(more.stdout) == reference


BROKEN_EXPORT = """
# A broken exporter (the test's fault, not the product's): one row of the output head written as the next row's.
import interlude_workload.llm.export as export

_real = export.to_hf_tensors


def _off_by_one_row(params):
    tensors = _real(params)
    head = tensors["lm_head.weight"].copy()
    head[5] = head[6]
    tensors["lm_head.weight"] = head
    return tensors


export.to_hf_tensors = _off_by_one_row
"""


def test_an_export_that_fails_keeps_the_final_step_committed_and_marks_nothing(bucket: str, tmp_path: Path) -> None:
    """The commit comes first: a fine-tune whose export does not reproduce the model exits 2 (the agent's "retrying
    cannot help") with its final step committed, nothing of the export marked, and the prompt and the figures in
    its log and progress (where the control plane reads them). The same command with a sound exporter then only
    exports: it trains nothing again."""
    from interlude_workload import hf_export
    from interlude_workload.gcs import storage_client

    assert run_trainer(trainer_cmd(bucket, "ftx", steps=20, every=10)).returncode == 0
    (tmp_path / "sitecustomize.py").write_text(BROKEN_EXPORT)
    cmd = trainer_cmd(
        bucket, "ftx", "--init-from-stage", "train", "--data-date", "2024-01-05", stage="finetune", steps=10, every=5
    )
    broken = run_trainer(cmd, PYTHONPATH=str(tmp_path))
    out = broken.stdout + broken.stderr
    assert broken.returncode == 2, out
    assert out.index("checkpoint step 10 committed") < out.index("export of committed step 10 failed"), out
    assert "prompt 'Today is': numpy logits differ from JAX by" in out and "the largest |logit|" in out, out
    store = CheckpointStore(bucket, "ftx", "finetune")
    latest = store.latest(verify="full").checkpoint
    assert latest is not None and latest.step == 10
    progress = store.read_progress()
    assert progress["state"] == "failed" and "numpy logits differ from JAX" in progress["error"], progress
    client = storage_client()
    assert hf_export.read_marker(client, bucket, "ftx", "finetune") is None
    listed = [b.name for b in client.list_blobs(bucket, prefix=layout_export("ftx"))]
    assert listed == [], listed  # verified before any upload: nothing of it in GCS at all

    retry = run_trainer(cmd)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert "final step 10 already committed" in retry.stdout and "checkpoint step" not in retry.stdout
    assert "written and verified" in retry.stdout
    marker = hf_export.read_marker(client, bucket, "ftx", "finetune")
    assert marker is not None and marker["step"] == 10 and marker["params_sha256"] == latest.extra["weights_sha256"]


def layout_export(run_key: str) -> str:
    from interlude_workload import layout

    return layout.export_prefix(run_key, "finetune")
