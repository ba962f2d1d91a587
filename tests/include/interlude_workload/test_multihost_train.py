"""The reference trainer over two worker processes on loopback (jax.distributed, gloo), as a 2-host slice runs it.

Each worker is a real process with its own log; the tests read the workers' own logs and the bucket, never the
trainer's account of itself. Facts checked:

* two workers train the same model as one (the batch's rows split between them): their weights equal one
  process's to float32 rounding (the sums over the batch are split, so not bit for bit; see
  ``llm.train_step.sharded_train_step``) and both workers end with bit-identical weights;
* SIGTERM to one worker: every worker commits the same step and exits 143; both restarted resume at that step (zero
  steps recomputed) and end bit-identical to an uninterrupted two-worker run;
* a maintenance notice on one worker's metadata server: every worker commits the same step and holds there, and
  trains on when it is withdrawn;
* a worker SIGKILLed in the middle of a save: that step is never committed (Orbax's primary finalises only once
  every worker's part is in), the restarted slice resumes from the step before, and still ends bit-identical.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.testing import GcsEmulator, free_port

from .trainer_proc import digest_of, run_trainer, start_trainer, trainer_cmd, wait_for_text

STEPS = 40
EVERY = 10
# Largest difference of any weight between the two-worker and the one-process run after STEPS AdamW steps of the
# tiny model (measured on 1 vs 2 and 4 devices: 8e-7 at 40 steps with two, 1.9e-6 at 60 with four); weights are of
# order 1.
TOLERANCE = 1e-5

# Worker 1 SIGKILLs itself once the first object of step KILL_STEP is in the bucket (each worker writes its part of
# a step: state/ocdbt.process_N/): a real kill in the middle of a real save, with its leftovers in GCS.
_KILL_MID_SAVE = """
import os, signal, sys, threading, time
from interlude_workload import orbax_io, train
from interlude_workload.checkpoints import CheckpointStore
original = orbax_io.save
def save(manager, step, *args, **kwargs):
    if step == {step}:
        store = CheckpointStore({bucket!r}, {run_key!r}, "train")
        prefix = store.step_prefix(step)
        def kill_when_written():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(store.client.list_blobs({bucket!r}, prefix=prefix)):
                time.sleep(0.005)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=kill_when_written, daemon=True).start()
    return original(manager, step, *args, **kwargs)
orbax_io.save = save
sys.exit(train.main(sys.argv[1:]))
"""


def _worker_cmds(bucket: str, run_key: str, *extra: str, workers: int = 2, steps: int = STEPS) -> list[list[str]]:
    coordinator = f"127.0.0.1:{free_port()}"
    return [
        trainer_cmd(
            bucket,
            run_key,
            *extra,
            "--num-workers",
            str(workers),
            "--worker-id",
            str(index),
            "--coordinator",
            coordinator,
            steps=steps,
            every=EVERY,
        )
        for index in range(workers)
    ]


def _start(cmds: list[list[str]], logs: list[Path]) -> list[subprocess.Popen[bytes]]:
    return [start_trainer(cmd, log) for cmd, log in zip(cmds, logs, strict=True)]


def _wait_all(procs: list[subprocess.Popen[bytes]], timeout: float = 240) -> list[int]:
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _slice(bucket: str, run_key: str, tmp_path: Path, *extra: str) -> tuple[list[int], list[str]]:
    """Run both workers to the end; their exit codes and their own logs."""
    logs = [tmp_path / f"{run_key}-w{index}.log" for index in range(2)]
    codes = _wait_all(_start(_worker_cmds(bucket, run_key, *extra), logs))
    return codes, [log.read_text(errors="replace") for log in logs]


def _final_params(bucket: str, run_key: str) -> dict[str, np.ndarray]:
    """The final step's weights as GCS holds them, restored onto this process's one device."""
    from interlude_workload import model, orbax_io
    from interlude_workload.llm.train_step import state_arrays

    store = CheckpointStore(bucket, run_key, "train")
    checkpoint = store.latest(verify="full").checkpoint
    assert checkpoint is not None and checkpoint.step == STEPS
    with orbax_io.bound_to(store):
        items = orbax_io.read_step(store, checkpoint, target=model.abstract_state("tiny"))
    return state_arrays(items[orbax_io.STATE_ITEM]["params"])


@pytest.fixture(scope="module")
def two_workers(gcs_emulator: GcsEmulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One uninterrupted two-worker run and one one-process run of the same training, in a bucket of their own:
    (bucket, the two workers' final digest)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
        bucket = "b-multihost-reference"
        gcs_emulator.create_bucket(bucket)
        codes, outputs = _slice(bucket, "two", tmp_path_factory.mktemp("reference"))
        assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
        digests = {digest_of(output) for output in outputs}
        assert len(digests) == 1, digests  # both workers hold the same weights, bit for bit
        one = run_trainer(trainer_cmd(bucket, "one", steps=STEPS, every=EVERY))
        assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
        yield bucket, digests.pop()


def test_two_workers_train_what_one_process_trains(two_workers: tuple[str, str], gcs_emulator: GcsEmulator) -> None:
    bucket, digest = two_workers
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
        two, one = _final_params(bucket, "two"), _final_params(bucket, "one")
    assert two.keys() == one.keys()
    worst = max(float(np.max(np.abs(two[name] - one[name]))) for name in one)
    assert worst <= TOLERANCE, worst
    assert max(float(np.max(np.abs(values))) for values in one.values()) > 0.1  # trained weights, not zeros


def test_sigterm_to_one_worker_stops_every_worker_at_one_committed_step(
    two_workers: tuple[str, str], bucket: str, tmp_path: Path
) -> None:
    _, reference = two_workers
    logs = [tmp_path / f"w{index}.log" for index in range(2)]
    cmds = _worker_cmds(bucket, "termed", "--step-seconds", "0.03")
    procs = _start(cmds, logs)
    try:
        assert wait_for_text(logs[1], "committed in", procs[1]), logs[1].read_text()[-3000:]
        procs[1].send_signal(signal.SIGTERM)  # one worker only, as a maintenance of one TPU VM would
    finally:
        codes = _wait_all(procs)
    outputs = [log.read_text(errors="replace") for log in logs]
    assert codes == [143, 143], outputs[0][-3000:] + outputs[1][-3000:]
    stopped = [_stopped_step(output) for output in outputs]
    assert stopped[0] == stopped[1] < STEPS, stopped
    assert "SIGTERM on another worker: every worker commits" in outputs[0]
    latest = CheckpointStore(bucket, "termed", "train").latest(verify="full").checkpoint
    assert latest is not None and latest.step == stopped[0]

    marks = [len(output) for output in outputs]
    codes = _wait_all(_start(_worker_cmds(bucket, "termed", "--step-seconds", "0.03"), logs))
    outputs = [log.read_text(errors="replace")[mark:] for log, mark in zip(logs, marks, strict=True)]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for output in outputs:
        assert f"resume point: step {stopped[0]} " in output  # zero steps recomputed, on every worker
        assert digest_of(output) == reference


def test_a_worker_killed_mid_save_never_makes_that_step_the_latest(
    two_workers: tuple[str, str], bucket: str, tmp_path: Path
) -> None:
    _, reference = two_workers
    kill_step = 2 * EVERY
    logs = [tmp_path / f"w{index}.log" for index in range(2)]
    cmds = _worker_cmds(bucket, "killed")
    cmds[1][1:3] = ["-c", _KILL_MID_SAVE.format(step=kill_step, bucket=bucket, run_key="killed")]
    procs = _start(cmds, logs)
    try:
        assert procs[1].wait(timeout=240) == -signal.SIGKILL, logs[1].read_text()[-3000:]
        store = CheckpointStore(bucket, "killed", "train")
        left = [blob.name for blob in store.client.list_blobs(bucket, prefix=store.step_prefix(kill_step))]
        assert left, "the kill came before the save wrote anything"
        assert store.latest().checkpoint.step == kill_step - EVERY  # worker 0 lives on, and cannot finalise alone
    finally:
        procs[0].kill()  # the slice restarts as a whole (a crashed worker is a slice interruption)
        _wait_all(procs)
    assert store.latest(verify="full").checkpoint.step == kill_step - EVERY, left

    codes, outputs = _slice(bucket, "killed", tmp_path)
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    for output in outputs:
        assert f"resume point: step {kill_step - EVERY} " in output
        assert digest_of(output) == reference
    assert f"checkpoint step {kill_step} committed" in outputs[0]  # the leftover is cleared and saved whole


def test_a_notice_on_one_worker_is_every_workers_checkpoint_and_hold(
    two_workers: tuple[str, str], bucket: str, tmp_path: Path
) -> None:
    """Worker 1's metadata server announces maintenance (each TPU VM of a slice has its own): both workers commit
    the same step, both hold there, both train on when the notice is withdrawn, and end as if nothing happened."""
    from benchmarks.multihost_restore import Metadata

    _, reference = two_workers
    metadata = Metadata()
    logs = [tmp_path / f"w{index}.log" for index in range(2)]
    cmds = _worker_cmds(bucket, "noticed", "--step-seconds", "0.03", "--hold-margin-seconds", "0")
    procs = [
        start_trainer(cmd, log, INTERLUDE_METADATA_URL=metadata.url(f"w{index}"))
        for index, (cmd, log) in enumerate(zip(cmds, logs, strict=True))
    ]
    try:
        assert wait_for_text(logs[0], "step 10/", procs[0]), logs[0].read_text()[-3000:]
        metadata.announce("w1", "TERMINATE_ON_HOST_MAINTENANCE")
        for log, proc in zip(logs, procs, strict=True):
            assert wait_for_text(log, "holding at committed step", proc), log.read_text()[-3000:]
        metadata.announce("w1", "NONE")
    finally:
        codes = _wait_all(procs)
    outputs = [log.read_text(errors="replace") for log in logs]
    assert codes == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    held = [re.findall(r"holding at committed step (\d+)", output) for output in outputs]
    assert held[0] == held[1] and len(held[0]) == 1, held
    assert f"checkpoint step {held[0][0]} committed" in outputs[0] and "(notice)" in outputs[0]
    assert "another worker has a maintenance notice" in outputs[0]
    assert all("hold released: notice cleared" in output for output in outputs)
    assert {digest_of(output) for output in outputs} == {reference}


def test_each_worker_learns_who_it_is_from_flags_env_or_its_tpu_vm_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.multihost_restore import Metadata
    from interlude_workload import distributed

    metadata = Metadata()
    # Google's two formats of worker-network-endpoints: name:id:ip triples (older) and plain hostnames
    metadata.attributes["tpu"] = {
        "agent-worker-number": "2",
        "worker-network-endpoints": "a:0:10.0.0.5,b:1:10.0.0.6,c:2:10.0.0.7,d:3:10.0.0.8",
    }
    metadata.attributes["hosts"] = {"agent-worker-number": "0", "worker-network-endpoints": "t-w-0,t-w-1"}
    metadata.attributes["single"] = {"agent-worker-number": "0", "worker-network-endpoints": "t-w-0"}
    for name in (distributed.NUM_WORKERS_ENV, distributed.WORKER_ID_ENV, distributed.COORDINATOR_ENV):
        monkeypatch.delenv(name, raising=False)
    assert distributed.resolve(metadata_url=metadata.url("tpu")) == distributed.Workers(4, 2, "10.0.0.5:8482")
    assert distributed.resolve(metadata_url=metadata.url("hosts")) == distributed.Workers(2, 0, "t-w-0:8482")
    assert distributed.resolve(metadata_url=metadata.url("single")) == distributed.Workers()
    assert distributed.resolve(metadata_url=metadata.url("gce-vm")) == distributed.Workers()  # 404: not a TPU VM
    assert distributed.resolve(metadata_url=None) == distributed.Workers()
    monkeypatch.setenv(distributed.NUM_WORKERS_ENV, "2")
    monkeypatch.setenv(distributed.WORKER_ID_ENV, "1")
    monkeypatch.setenv(distributed.COORDINATOR_ENV, "127.0.0.1:5000")
    # the environment (a local cloud's) wins over the metadata server, flags over both
    assert distributed.resolve(metadata_url=metadata.url("tpu")) == distributed.Workers(2, 1, "127.0.0.1:5000")
    assert distributed.resolve(4, 3, "h:1", metadata.url("tpu")) == distributed.Workers(4, 3, "h:1")
    with pytest.raises(ValueError, match="worker id 2 does not fit 2"):
        distributed.resolve(worker_id=2)
    monkeypatch.delenv(distributed.COORDINATOR_ENV)
    with pytest.raises(ValueError, match="need a coordinator"):
        distributed.resolve()


def _stopped_step(output: str) -> int:
    lines = [line for line in output.splitlines() if "stopped by SIGTERM after committing step" in line]
    assert len(lines) == 1, output[-3000:]
    return int(lines[0].rsplit(" ", 1)[1])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-n", "0", "-q"]))
