"""The two container entrypoints run for real: serve with a (fake) device, idle cleanly without one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from interlude_workload.gcs import storage_client
from interlude_workload.testing import free_port

from .standin_proc import ENTRYPOINTS, STANDIN, running, upload_export

TPU = str(ENTRYPOINTS / "tpu_serve.sh")
GPU = str(ENTRYPOINTS / "gpu_serve.sh")
# A command that proves it ran, with its arguments intact (spaces, globs, quotes survive the script).
PROBE = [sys.executable, "-c", "import os, sys; print('SERVED', sys.argv[1:], os.environ.get('TPU_TOPOLOGY'))"]
TRICKY = ["a b", "*", "$HOME", "'q'"]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{tmp / 'bin'}:/usr/bin:/bin"  # no nvidia-smi unless the test puts one there
    env.update(extra)
    return env


def _fake_nvidia_smi(tmp: Path) -> None:
    tool = tmp / "bin" / "nvidia-smi"
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA L4 (UUID: GPU-fake)'\n")
    tool.chmod(0o755)


def _fake_tpu_root(tmp: Path, device: str) -> Path:
    root = tmp / "node-root"
    (root / device).parent.mkdir(parents=True, exist_ok=True)
    (root / device).write_text("")
    return root


@pytest.mark.parametrize("device", ["dev/vfio/0", "dev/accel0"])
def test_tpu_entrypoint_serves_when_a_tpu_device_exists(tmp_path: Path, device: str) -> None:
    root = _fake_tpu_root(tmp_path, device)
    env = _env(tmp_path, INTERLUDE_DEVICE_ROOT=f"{root}/", TPU_ACCELERATOR_TYPE="v6e-1", TPU_TOPOLOGY="1x1")
    done = subprocess.run([TPU, *PROBE, *TRICKY], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "TPU found: accelerator type v6e-1, topology 1x1" in done.stdout
    assert f"SERVED {TRICKY!r} 1x1" in done.stdout


def test_tpu_entrypoint_warns_without_tpu_env(tmp_path: Path) -> None:
    env = _env(tmp_path, INTERLUDE_DEVICE_ROOT=str(_fake_tpu_root(tmp_path, "dev/accel0")))
    env.pop("TPU_ACCELERATOR_TYPE", None)
    env.pop("TPU_TOPOLOGY", None)
    done = subprocess.run([TPU, *PROBE], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "SERVED" in done.stdout and "not set" in done.stderr


def test_gpu_entrypoint_serves_when_nvidia_smi_is_on_path(tmp_path: Path) -> None:
    _fake_nvidia_smi(tmp_path)
    done = subprocess.run([GPU, *PROBE, *TRICKY], env=_env(tmp_path), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "GPU found: GPU 0: NVIDIA L4" in done.stdout and f"SERVED {TRICKY!r}" in done.stdout


@pytest.mark.parametrize("script", [TPU, GPU])
def test_without_the_device_it_idles_and_stops_on_sigterm(tmp_path: Path, script: str) -> None:
    env = _env(tmp_path, INTERLUDE_DEVICE_ROOT=str(tmp_path / "empty-root"))
    proc = subprocess.Popen([script, *PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        assert proc.poll() is None  # idling, not exited (a pod restart loop would follow an exit)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "idling" in out and "SERVED" not in out


@pytest.mark.parametrize("script", [TPU, GPU])
def test_no_command_is_a_usage_error(script: str) -> None:
    done = subprocess.run([script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "usage" in done.stderr


def test_tpu_entrypoint_runs_the_stand_in_for_real(bucket: str, tmp_path: Path, exports: dict[int, Path]) -> None:
    uri = upload_export(exports[1], storage_client(), bucket, "interlude/entry/finetune/export")
    root = _fake_tpu_root(tmp_path, "dev/vfio/0")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, INTERLUDE_DEVICE_ROOT=str(root), TPU_ACCELERATOR_TYPE="v6e-1", TPU_TOPOLOGY="1x1")
    # the guide's style: vllm's --flag=value form and --model instead of the positional model
    cmd = [TPU, sys.executable, str(STANDIN), "serve", f"--model={uri}", f"--port={port}", "--max-model-len=128"]
    cmd += ["--load-format=runai_streamer"]
    with running(cmd, base, env=env) as proc:
        body = requests.post(f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30).json()
        assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["finish_reason"] in ("length", "stop")
        proc.terminate()  # exec: SIGTERM reaches the server itself
        assert proc.wait(timeout=20) == 0
