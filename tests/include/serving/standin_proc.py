"""Start the vLLM stand-in as a real process and wait for it (shared by the serving tests)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import requests

from interlude_workload import model
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.sdk import encode_payload

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ROOT / "include" / "serving" / "vllm_standin.py"
ENTRYPOINTS = ROOT / "plugins" / "interlude" / "serving" / "entrypoint_scripts"


def write_checkpoint(bucket: str, run_key: str, step: int, seed: int) -> tuple[str, dict[str, np.ndarray]]:
    """A committed reference-model checkpoint, written as the trainer writes it; returns its URI and weights."""
    params = model.init_params(np.random.default_rng(seed), features=4, classes=3)
    arrays = {f"param_{k}": v for k, v in params.items()}
    result = CheckpointStore(bucket, run_key, "finetune").write(step, encode_payload(arrays, {"seed": seed}))
    return result.checkpoint.uri, params


def wait_healthy(base: str, proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"stand-in exited with {proc.returncode}: {proc.communicate()}")
        try:
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"stand-in not healthy within {timeout}s")


@contextmanager
def running(cmd: list[str], base: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_healthy(base, proc)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def standin_cmd(uri: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, str(STANDIN), "serve", uri, "--port", str(port), *extra]
