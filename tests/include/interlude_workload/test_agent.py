"""The machine agent never dies silently: GCS errors are said, backed off and retried; SIGTERM ends it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interlude_workload.agent import backoff


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    import random

    rng = random.Random(1)
    delays = [backoff(n, 1.0, cap=60.0, rng=rng) for n in range(1, 12)]
    assert all(0.5 <= d <= 60.0 for d in delays)
    assert delays[0] <= 1.0 and delays[-1] >= 30.0


def test_an_unreachable_gcs_is_retried_until_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    env = {**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}  # port 9: refused at once
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "interlude_workload.agent", "--bucket", "b", "--run-key", "k", "--idle-poll", "0.2"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "agent: error #2" not in log.read_text(errors="replace"):  # said, backed off, tried again
            assert proc.poll() is None, f"the agent died:\n{log.read_text()}"
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "retrying in" in text and "heartbeat not written" in text and "agent: stopping" in text


def test_sigterm_ends_a_long_pause_without_the_handler_taking_a_lock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's SIGTERM handler only sets a flag (a lock taken in a handler can deadlock the main thread);
    its pauses (idle polls, back-off) poll that flag, so a stop ends them at the next poll (0.2 s), not at the end
    of the pause. On a clock of the test's own, the signal comes in the main thread during the third poll's sleep,
    as a real one does: no sleep after it."""
    import interlude_workload.agent as agent_module
    from interlude_workload.agent import Agent

    agent = Agent("no-bucket", "no-run", idle_poll=30.0)
    slept: list[float] = []

    class Clock:
        now = 0.0

        @classmethod
        def monotonic(cls) -> float:
            return cls.now

        @classmethod
        def sleep(cls, seconds: float) -> None:
            assert not agent.stopping, f"slept again after SIGTERM: {slept}"
            slept.append(seconds)
            cls.now += seconds
            if len(slept) == 3:
                agent._on_term(signal.SIGTERM, None)

    monkeypatch.setattr(agent_module, "time", Clock)
    agent._pause(30.0)
    assert agent.stopping and slept == [0.2, 0.2, 0.2], slept


def _agent(bucket: str, run_key: str, log: Path, *extra: str, **env: str) -> subprocess.Popen[bytes]:
    from .trainer_proc import trainer_env

    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "interlude_workload.agent", "--bucket", bucket, "--run-key", run_key,
             "--idle-poll", "0.2", *extra],
            env=trainer_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip


def _children(pid: int) -> list[str]:
    """The command lines of a process's children, from /proc (what the kernel says, not the agent)."""
    return [cmdline for _pid, cmdline in _child_processes(pid)]


def _child_processes(pid: int) -> list[tuple[int, str]]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            ppid = proc.name.isdigit() and (proc / "stat").read_text().rsplit(")", 1)[1].split()[1]
            if ppid == str(pid):
                found.append((int(proc.name), (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, IndexError):
            continue  # a process that ended while we looked
    return found


def _mapped(pid: int) -> str:
    """The files mapped into a process (its shared libraries among them), as the kernel lists them."""
    return Path(f"/proc/{pid}/maps").read_text()


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_trainer_is_a_warm_fork_that_commits_on_sigterm_and_a_cold_start_resumes_it(
    bucket: str, tmp_path: Path
) -> None:
    """Warm start (the default): the agent's child is a fork of the agent (its command line is the agent's), not a
    new interpreter, and the agent itself has Orbax's native parts loaded (the import the fork saves); SIGTERM
    to the agent reaches it, it commits its current step and the agent exits 0. A `--cold-start` agent then starts
    `python -m interlude_workload.train`, which resumes from that very step."""
    from interlude_workload.checkpoints import CheckpointStore
    from interlude_workload.plan import StagePlan, write_plan

    from .trainer_proc import wait_for_text

    write_plan(bucket, "warm", StagePlan(order=0, stage="train", steps=100_000, checkpoint_every=50, seed=3,
                                         step_seconds=0.01))  # fmt: skip
    log = tmp_path / "agent.log"
    warm = _agent(bucket, "warm", log)
    try:
        assert wait_for_text(log, "step 30/100000", warm, timeout=120), log.read_text()
        children = _children(warm.pid)
        assert len(children) == 1 and "interlude_workload.agent" in children[0], children
        # The agent imported numpy and Orbax (tensorstore's extension, JAX's) before it forked: the trainer's
        # ~2.5 s import of orbax.checkpoint is paid once per boot, not once per stage (interlude_workload.warm).
        trainer_pid = _child_processes(warm.pid)[0][0]
        for pid in (warm.pid, trainer_pid):
            maps = _mapped(pid)
            assert all(lib in maps for lib in ("_multiarray_umath", "_tensorstore", "jaxlib")), pid
    finally:
        assert _stop(warm) == 0, log.read_text()
    text = log.read_text()
    stopped = re.findall(r"stopped by SIGTERM (?:after committing|while holding at committed) step (\d+)", text)
    assert stopped, text
    latest = CheckpointStore(bucket, "warm", "train").latest().checkpoint
    assert latest is not None and latest.step == int(stopped[-1]) > 30

    start = len(log.read_text())
    cold = _agent(bucket, "warm", log, "--cold-start")
    try:
        assert wait_for_text(log, f"resume point: step {latest.step} ", cold, timeout=120, start_at=start)
        assert wait_for_text(log, f"step {latest.step // 10 * 10 + 10}/100000", cold, timeout=60, start_at=start)
        children = _children(cold.pid)
        assert len(children) == 1 and "interlude_workload.train" in children[0], children
    finally:
        assert _stop(cold) == 0, log.read_text()


def test_a_warm_trainers_exit_code_reaches_the_agent(bucket: str, tmp_path: Path) -> None:
    """A stage that finishes (exit 0) lets the agent go on to the next; one that cannot start (exit 2: nothing to
    initialise from) is not retried and is reported failed in its progress - both through the fork's waitpid."""
    from interlude_workload.checkpoints import CheckpointStore
    from interlude_workload.plan import StagePlan, write_plan

    write_plan(bucket, "codes", StagePlan(order=0, stage="train", steps=20, checkpoint_every=10, seed=1))
    write_plan(bucket, "codes", StagePlan(order=1, stage="finetune", steps=5, checkpoint_every=5, seed=1,
                                          init_from_stage="nosuchstage"))  # fmt: skip
    log = tmp_path / "agent.log"
    agent = _agent(bucket, "codes", log)
    try:
        deadline = time.monotonic() + 120
        while "agent: stage finetune failed" not in log.read_text():
            assert agent.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        assert _stop(agent) == 0, log.read_text()
    text = log.read_text()
    assert "final digest" in text and text.count("agent: starting stage finetune") == 1, text
    assert CheckpointStore(bucket, "codes", "train").latest().checkpoint.step == 20  # type: ignore[union-attr]
    progress = CheckpointStore(bucket, "codes", "finetune").read_progress() or {}
    assert progress.get("state") == "failed" and "exited 2" in str(progress.get("error")), progress


IMPORTED = re.compile(r"^import '([\w.]+)' # ", re.MULTILINE)  # python -v: a module loaded (not one refused)


def test_the_agent_and_its_trainer_import_no_optional_module_the_workload_does_not_use(
    bucket: str, tmp_path: Path
) -> None:
    """Every import is paid again after each maintenance, before training again (interlude_workload.lean). The
    interpreter itself lists what the agent and its forked trainer load (PYTHONVERBOSE, on stderr):
    google-cloud-storage, numpy and Orbax, but not requests' charset detection or OpenTelemetry (traces off); the
    stage still trains to its final step. (gRPC is loaded: gcsfs, Orbax's client for gs:// paths, imports it.)"""
    from interlude_workload.plan import StagePlan, write_plan

    write_plan(bucket, "lean", StagePlan(order=0, stage="train", steps=20, checkpoint_every=10, seed=1))
    log = tmp_path / "agent.log"
    agent = _agent(bucket, "lean", log, PYTHONVERBOSE="1", ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES="")
    try:
        deadline = time.monotonic() + 120
        while "final digest" not in log.read_text():
            assert agent.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        assert _stop(agent) == 0, log.read_text()[-3000:]
    text = log.read_text()
    imported = set(IMPORTED.findall(text))
    expected = {"google.cloud.storage", "numpy", "interlude_workload.train", "orbax.checkpoint", "gcsfs"}
    assert expected <= imported, sorted(expected - imported)
    for skipped in ("chardet", "charset_normalizer", "opentelemetry"):
        assert skipped not in imported, skipped
    assert "RequestsDependencyWarning" not in text, text[-3000:]


def test_opentelemetry_stays_importable_when_storage_is_asked_for_traces_or_metrics() -> None:
    """The variables google-cloud-storage reads to record traces / metrics keep OpenTelemetry importable."""
    code = "from interlude_workload import lean; lean.skip_optional_imports(); import opentelemetry.trace"
    for env in ({}, {"ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES": "true"}, {"GCP_STORAGE_PYTHON_ENABLE_OTEL_METRICS": "1"}):
        clean = {k: v for k, v in os.environ.items() if k not in lean_env()}
        done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True)
        assert (done.returncode == 0) == bool(env), (env, done.stderr[-500:])


def lean_env() -> tuple[str, ...]:
    from interlude_workload.lean import TELEMETRY_ENV

    return TELEMETRY_ENV


def test_no_warm_fork_from_a_process_with_a_native_thread() -> None:
    """A library's own thread pool (here OpenBLAS's, started when numpy is imported without a thread limit) is
    invisible to ``threading`` but forking past it is as unsafe as past a Python thread: the agent must start the
    trainer as a command then. With the pool limited to one thread (what the trainer's import sets), it may fork."""
    code = (
        "import os, threading, numpy; from interlude_workload import warm; "
        "print(threading.active_count(), warm.native_threads(), warm.can_fork())"
    )
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    pooled = subprocess.run([sys.executable, "-c", code], env={**clean, "OPENBLAS_NUM_THREADS": "2"},
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert pooled[0] == "1" and int(pooled[1]) > 1 and pooled[2] == "False", pooled
    single = subprocess.run([sys.executable, "-c", code], env={**clean, "OPENBLAS_NUM_THREADS": "1"},
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    assert single == ["1", "1", "True"], single
