"""Start the vLLM stand-in as a real process and wait for it; make and upload model exports (shared by the serving
tests, the e2e serving tests and the demo-serve test)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[3]
STANDIN = ROOT / "include" / "serving" / "vllm_standin.py"
ENTRYPOINTS = ROOT / "plugins" / "interlude" / "serving" / "entrypoint_scripts"


def make_export(out: Path, seed: int) -> Path:
    """A Hugging Face export of a freshly initialised reference model (JAX init from `seed`), written and
    verified by the workload's own `export_hf`; its interlude_reference.json holds the JAX model's greedy
    completions of fixed prompts."""
    import jax

    from interlude_workload.llm import export, model
    from interlude_workload.llm.config import LlamaConfig
    from interlude_workload.llm.tokenizer import SHIPPED_DIR, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, tokenizer_config

    tokenizer_dir = out.parent / f"{out.name}-tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SHIPPED_DIR / TOKENIZER_FILE, tokenizer_dir / TOKENIZER_FILE)
    shipped_config = SHIPPED_DIR / TOKENIZER_CONFIG_FILE
    if shipped_config.is_file():
        shutil.copyfile(shipped_config, tokenizer_dir / TOKENIZER_CONFIG_FILE)
    else:
        (tokenizer_dir / TOKENIZER_CONFIG_FILE).write_text(json.dumps(tokenizer_config(), indent=2) + "\n")
    config = LlamaConfig()
    export.export_hf(model.init_params(config, jax.random.key(seed)), config, tokenizer_dir, out)
    return out


def upload_export(local: Path, client: object, bucket: str, prefix: str, skip: tuple[str, ...] = ()) -> str:
    """Copy an export directory's files to gs://bucket/prefix/ (as `gcloud storage cp -r` would); its URI."""
    target = client.bucket(bucket)  # type: ignore[attr-defined]
    for path in sorted(local.iterdir()):
        if path.is_file() and path.name not in skip:
            target.blob(f"{prefix}/{path.name}").upload_from_filename(str(path))
    return f"gs://{bucket}/{prefix}"


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
