"""The rendered startup script, run by real bash: quoting, logging, exit codes, SIGTERM forwarding."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.startup import render

from .trainer_proc import UNREACHABLE_METADATA, digest_of, wait_for_text


def _env(tmp_path: Path) -> dict[str, str]:
    bin_dir = Path(sys.executable).parent  # as on the local cloud: python3 on PATH is the venv's
    return {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "INTERLUDE_LOG_DIR": str(tmp_path / "logs"),
        "INTERLUDE_METADATA_URL": UNREACHABLE_METADATA,
    }


def _script(tmp_path: Path, **kwargs: object) -> Path:
    path = tmp_path / "startup.sh"
    path.write_text(render(**kwargs))  # type: ignore[arg-type]
    return path


def test_script_runs_trainer_logs_and_exits_zero(bucket: str, tmp_path: Path) -> None:
    hostile = "tok'en; touch $HOME/pwned `id`"
    script = _script(
        tmp_path,
        bucket=bucket,
        run_key="boot",
        stage="train",
        steps=12,
        checkpoint_every=5,
        seed=3,
        fresh=hostile,
        env={"EXTRA": "$(touch pwned)"},
    )
    done = subprocess.run(
        ["bash", str(script)], env=_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "logs" / "interlude-boot-train.log").read_text()
    assert "boot: starting train of boot" in log and "trainer finished" in log
    assert digest_of(log) == digest_of(done.stdout)  # the serial console sees what the file log sees
    assert CheckpointStore(bucket, "boot", "train").fresh_token() == hostile  # passed through verbatim
    assert not (tmp_path / "pwned").exists()


def test_script_forwards_sigterm_and_returns_trainer_code(bucket: str, tmp_path: Path) -> None:
    script = _script(
        tmp_path, bucket=bucket, run_key="term", stage="train", steps=400, checkpoint_every=100, step_seconds=0.02
    )
    log = tmp_path / "logs" / "interlude-term-train.log"
    proc = subprocess.Popen(
        ["bash", str(script)], env=_env(tmp_path), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        (tmp_path / "logs").mkdir(exist_ok=True)
        log.touch()
        wait_for_text(log, "step 10/400", proc)  # type: ignore[arg-type]
        proc.send_signal(signal.SIGTERM)  # only bash, as a service manager may do
        assert proc.wait(timeout=30) == 143
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "SIGTERM: forwarding to trainer" in text and "trainer exited with 143" in text
    stopped = int(text.split("stopped by SIGTERM after committing step ")[1].split()[0])
    assert CheckpointStore(bucket, "term", "train").latest().checkpoint.step == stopped


def test_script_fails_clearly_without_python_or_package(bucket: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    missing = _script(
        tmp_path, bucket=bucket, run_key="x", stage="train", steps=1, checkpoint_every=1, python="no-such-python"
    )
    assert subprocess.run(["bash", str(missing)], env=env, cwd=tmp_path, capture_output=True).returncode == 127
    no_pkg = _script(
        tmp_path, bucket=bucket, run_key="x", stage="train", steps=1, checkpoint_every=1, python="/usr/bin/python3"
    )
    out = subprocess.run(["bash", str(no_pkg)], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 3 and "cannot import interlude_workload" in out.stdout


def test_the_script_names_its_boot_and_says_when_it_ends(tmp_path) -> None:
    """The control plane tells boots apart and sees a dead workload on the serial console."""
    import subprocess

    from interlude_workload.startup import render_agent

    script = render_agent(bucket="b", run_key="k", python="/nonexistent/python3")
    env = {"PATH": "/usr/bin:/bin", "INTERLUDE_LOG_DIR": str(tmp_path), "INTERLUDE_MACHINE_ID": "m"}
    runs = [
        subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30) for _ in range(2)
    ]
    boots = [r.stdout.split("startup: begin: boot ", 1)[1].split()[0] for r in runs]
    assert boots[0] != boots[1], "a new id on every boot"
    for run, boot in zip(runs, boots, strict=True):
        assert run.returncode == 127 and f"startup: end (exit 127) boot {boot}" in run.stdout


def test_periodic_only_reaches_the_trainer_as_its_own_flag() -> None:
    """The naive baseline of benchmarks/badput.py: one flag, parsed by the trainer, absent by default."""
    from interlude_workload.startup import trainer_args
    from interlude_workload.train import parse_args

    common = {"bucket": "b", "run_key": "k", "stage": "train", "steps": 10, "checkpoint_every": 5}
    assert "--periodic-only" not in trainer_args(**common)
    assert parse_args(trainer_args(**common, periodic_only=True)).periodic_only


def test_a_slow_metadata_server_does_not_delay_the_start_and_the_end_still_lands_after_the_begin(
    tmp_path: Path,
) -> None:
    """The begin guest attribute goes in the background (nothing but bash builtins runs before the workload
    starts: the time between a boot and training again); the end waits for it, so the control plane never
    reads the begin after the end. The boot's start time and the log's stamps are what they were (epoch
    seconds; UTC whatever the machine's time zone)."""
    import calendar
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from interlude_workload.startup import render_agent

    answered: list[tuple[float, str]] = []

    class SlowMetadata(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"])).decode()
            if "end (exit" not in body:
                time.sleep(1.0)  # the begin: a metadata server that answers late
            answered.append((time.time(), body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowMetadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    started = tmp_path / "started"
    stub = tmp_path / "python3"  # the "workload": says when it started and with what, and ends at once
    stub.write_text(f'#!/bin/bash\necho "$EPOCHREALTIME $INTERLUDE_BOOT_STARTED_AT $INTERLUDE_BOOT_ID" > {started}\n')
    stub.chmod(0o755)
    env = {
        "PATH": "/usr/bin:/bin",
        "TZ": "Asia/Tokyo",
        "INTERLUDE_LOG_DIR": str(tmp_path),
        "INTERLUDE_MACHINE_ID": "m",
        "INTERLUDE_METADATA_URL": f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1",
    }
    before = time.time()
    try:
        run = subprocess.run(
            ["bash", "-c", render_agent(bucket="b", run_key="k", python=str(stub))],
            env=env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stdout + run.stderr
    workload_at, boot_started_at, boot = started.read_text().split()
    assert before <= float(boot_started_at) <= float(workload_at) < answered[0][0], (before, answered)
    assert [body.startswith(f"startup: begin: boot {boot}") for _, body in answered] == [True, True]
    assert "end (exit 0)" not in answered[0][1] and f"end (exit 0) boot {boot}" in answered[1][1], answered
    stamp = run.stdout.split(" startup: begin: boot ", 1)[0]
    # The log's stamp is UTC (the machine's TZ is Tokyo's, 9 hours off), of a moment of this run (whole seconds)
    assert int(before) <= calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) <= time.time(), (before, stamp)
