"""Run the reference trainer as a real subprocess (helpers shared by the workload tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

DIGEST = re.compile(r"final digest ([0-9a-f]{64})")
UNREACHABLE_METADATA = "http://127.0.0.1:9/computeMetadata/v1"  # port 9 (discard): refused at once


def trainer_cmd(
    bucket: str, run_key: str, *extra: str, stage: str = "train", steps: int = 40, every: int = 5, seed: int = 7
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "interlude_workload.train",
        "--bucket",
        bucket,
        "--run-key",
        run_key,
        "--stage",
        stage,
        "--steps",
        str(steps),
        "--checkpoint-every",
        str(every),
        "--seed",
        str(seed),
        *extra,
    ]


def trainer_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("INTERLUDE_METADATA_URL", UNREACHABLE_METADATA)
    env.update(overrides)
    return env


def run_trainer(cmd: list[str], timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=trainer_env(**env), capture_output=True, text=True, timeout=timeout)


def digest_of(output: str) -> str:
    found = DIGEST.findall(output)
    assert found, f"no final digest in output:\n{output[-3000:]}"
    return found[-1]


def start_trainer(cmd: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    handle = log.open("ab")
    try:
        return subprocess.Popen(cmd, env=trainer_env(**env), stdout=handle, stderr=subprocess.STDOUT)
    finally:
        handle.close()


def wait_for_text(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 120, start_at: int = 0) -> bool:
    """Wait until ``text`` appears in the log after byte ``start_at``; False when the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace")[start_at:]:
            return True
        if proc.poll() is not None:
            return text in log.read_text(errors="replace")[start_at:]
        time.sleep(0.02)
    raise AssertionError(f"{text!r} not seen in {timeout}s:\n{log.read_text()[-3000:]}")
