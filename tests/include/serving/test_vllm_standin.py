"""The vLLM stand-in as a real process serving a real model export (written by the workload's `export_hf`) from the
GCS emulator with the Run:ai streamer, or from a local directory as a Cloud Storage FUSE mount shows it.

What it answers is checked against computations independent of the stand-in: the JAX model's own greedy tokens
(recorded in the export's interlude_reference.json by `export_hf`), the workload's numpy `greedy_generate`, and
the sha256 of the weight file read here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from interlude_workload.gcs import storage_client
from interlude_workload.testing import free_port

from .standin_proc import STANDIN, running, standin_cmd, upload_export

PREFIX = "interlude/run-1/finetune/export-00000030"


def _reference(export: Path) -> list[dict[str, Any]]:
    return list(json.loads((export / "interlude_reference.json").read_text())["prompts"])


def _expected_text(export: Path, token_ids: list[int]) -> str:
    from tokenizers import Tokenizer

    return str(Tokenizer.from_file(str(export / "tokenizer.json")).decode(token_ids, skip_special_tokens=True))


def _complete(base: str, prompt: Any, **body: object) -> requests.Response:
    return requests.post(f"{base}/v1/completions", json={"prompt": prompt, **body}, timeout=60)


def _upload(bucket: str, export: Path, skip: tuple[str, ...] = ()) -> str:
    return upload_export(export, storage_client(), bucket, PREFIX, skip)


def test_serves_the_exports_own_greedy_tokens_from_gcs_with_the_streamer(bucket: str, exports: dict[int, Path]) -> None:
    export = exports[1]
    uri = _upload(bucket, export)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = standin_cmd(uri, port, "--load-format", "runai_streamer", "--served-model-name", "interlude-llm")
    cmd += ["--max-model-len", "128", "--tensor-parallel-size", "1", "--max-num-seqs", "4", "--disable-log-requests"]
    with running(cmd, base) as proc:
        models = requests.get(f"{base}/v1/models", timeout=10).json()
        assert [(m["id"], m["root"], m["max_model_len"]) for m in models["data"]] == [("interlude-llm", uri, 128)]
        weights_sha = hashlib.sha256((export / "model.safetensors").read_bytes()).hexdigest()
        for record in _reference(export):  # the JAX model's greedy tokens, recorded by export_hf
            body = _complete(base, record["text"], model="interlude-llm", max_tokens=16, temperature=0).json()
            [choice] = body["choices"]
            want = record["greedy_token_ids"]
            assert choice["text"] == _expected_text(export, want), record["text"]
            assert body["usage"] == {
                "prompt_tokens": len(record["token_ids"]),
                "completion_tokens": len(want),
                "total_tokens": len(record["token_ids"]) + len(want),
            }
            assert choice["finish_reason"] == ("stop" if want[-1] == 1 and len(want) < 16 else "length")
            assert body["system_fingerprint"] == f"fp_{weights_sha[:16]}"
        prompts = [r["text"] for r in _reference(export)[:2]]
        batch = _complete(base, prompts, max_tokens=5).json()
        assert [c["text"] for c in batch["choices"]] == [
            _complete(base, p, max_tokens=5).json()["choices"][0]["text"] for p in prompts
        ]
        wrong = _complete(base, "x", model="other")
        assert wrong.status_code == 404 and wrong.json()["type"] == "NotFoundError"
        too_long = _complete(base, "x " * 100, max_tokens=100)
        assert too_long.status_code == 400 and "maximum context length is 128" in too_long.json()["message"]
        assert requests.get(f"{base}/nope", timeout=10).status_code == 404
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0  # SIGTERM: clean shutdown
    assert "Detected Run:ai model config" not in out  # the streamer was asked for, not defaulted to


def test_another_export_from_a_local_directory_answers_with_its_own_weights(exports: dict[int, Path]) -> None:
    """A local directory (what a Cloud Storage FUSE mount shows) with vLLM's default --load-format auto; the
    answer is the workload's numpy greedy_generate over this export, and differs from the other export's."""
    from tokenizers import Tokenizer

    from interlude_workload.llm.numpy_forward import greedy_generate, load_export

    export = exports[2]
    weights, config = load_export(export)
    tok = Tokenizer.from_file(str(export / "tokenizer.json"))
    prompt = "Ada likes"
    want = tok.decode(greedy_generate(weights, config, tok.encode(prompt).ids, 12), skip_special_tokens=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running(standin_cmd(str(export), port), base):
        body = _complete(base, prompt, max_tokens=12).json()
        assert body["choices"][0]["text"] == want
        models = requests.get(f"{base}/v1/models", timeout=10).json()["data"]
        assert models[0]["root"] == str(export) and models[0]["max_model_len"] == config.max_position_embeddings
        other = [r for r in _reference(exports[1]) if r["text"] == prompt]
        assert other and _expected_text(exports[1], other[0]["greedy_token_ids"][:12]) != want  # weights matter


def test_generation_stops_at_an_end_of_sequence_id_left_out_of_the_text(
    exports: dict[int, Path], tmp_path: Path
) -> None:
    """generation_config.json's eos_token_id: vLLM stops there (finish_reason "stop"), counts the token, and does
    not put its text in the answer. Here the export's greedy second token is made an end-of-sequence id."""
    export = _copy(exports[2], tmp_path)
    record = next(r for r in _reference(export) if r["greedy_token_ids"][0] != r["greedy_token_ids"][1])
    first, second = record["greedy_token_ids"][:2]
    generation = json.loads((export / "generation_config.json").read_text())
    (export / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [1, second]}))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running(standin_cmd(str(export), port), base):
        body = _complete(base, record["text"], max_tokens=10).json()
    assert body["choices"][0]["finish_reason"] == "stop" and body["usage"]["completion_tokens"] == 2
    assert body["choices"][0]["text"] == _expected_text(export, [first])


def test_a_gcs_model_without_the_flag_is_streamed_as_vllm_overrides_auto(bucket: str, exports: dict[int, Path]) -> None:
    """vLLM (VllmConfig.__post_init__): an object-store model with load_format auto is loaded with runai_streamer,
    logged as "Detected Run:ai model config. Overriding `load_format` to 'runai_streamer'"."""
    uri = _upload(bucket, exports[1])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with running(standin_cmd(uri, port), base) as proc:
        assert _complete(base, "Today is", max_tokens=2).status_code == 200
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert "Detected Run:ai model config. Overriding `load_format` to 'runai_streamer'" in out


def _refused(model: str, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(STANDIN), "serve", model, "--port", str(free_port()), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--max-num-seqs", "many"], "invalid int value"),
        (["--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
        (["--load-forma", "runai_streamer"], "unrecognized arguments: --load-forma"),  # no prefix matching
    ],
)
def test_flags_are_checked_like_vllm(args: list[str], message: str) -> None:
    done = _refused("gs://bkt/interlude/run/finetune/export", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_an_unregistered_load_format_parses_and_fails_at_load_as_in_vllm(exports: dict[int, Path]) -> None:
    done = _refused(str(exports[1]), "--load-format", "bogus")
    assert done.returncode == 1 and "ValueError: Load format `bogus` is not supported" in done.stderr, done.stderr


def test_a_gcs_model_with_a_non_streamer_load_format_is_refused(bucket: str, exports: dict[int, Path]) -> None:
    uri = _upload(bucket, exports[1])
    done = _refused(uri, "--load-format", "safetensors")
    want = "ValueError: To load a model from S3, 'load_format' must be 'runai_streamer' or 'runai_streamer_sharded'"
    assert done.returncode == 1 and want in done.stderr and "but got 'safetensors'" in done.stderr, done.stderr


@pytest.mark.parametrize("where", ["gcs", "local"])
def test_an_export_without_config_json_is_refused(
    where: str, bucket: str, exports: dict[int, Path], tmp_path: Path
) -> None:
    if where == "gcs":
        model = _upload(bucket, exports[1], skip=("config.json",))
    else:
        model = str(_copy(exports[1], tmp_path, skip=("config.json",)))
    done = _refused(model, "--load-format", "runai_streamer")
    assert done.returncode == 1, done.stderr
    assert "ValueError: Invalid repository ID or local directory specified" in done.stderr
    assert "ensure the presence of a 'config.json'" in done.stderr


def _copy(export: Path, tmp: Path, skip: tuple[str, ...] = ()) -> Path:
    out = tmp / "export"
    out.mkdir()
    for path in export.iterdir():
        if path.name not in skip:
            (out / path.name).write_bytes(path.read_bytes())
    return out


def _rewrite_weights(directory: Path, change: Any) -> None:
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(directory / "model.safetensors"))
    change(weights)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda w: w.update({"lm_head.weight": w["lm_head.weight"][:-1]}),
            "AssertionError: Attempted to load weight (torch.Size([511, 256])) into parameter (torch.Size([512, 256]))",
        ),
        (lambda w: w.update({"model.extra.weight": w["model.norm.weight"]}), "KeyError: 'model.extra.weight'"),
        (lambda w: w.pop("model.norm.weight"), "ValueError: Following weights were not initialized from checkpoint"),
    ],
)
def test_tensors_that_do_not_fit_the_config_are_refused(
    change: Any, message: str, bucket: str, exports: dict[int, Path], tmp_path: Path
) -> None:
    broken = _copy(exports[1], tmp_path)
    _rewrite_weights(broken, change)
    done = _refused(upload_export(broken, storage_client(), bucket, PREFIX), "--load-format", "runai_streamer")
    assert done.returncode == 1 and message in done.stderr, done.stderr


def test_missing_weights_unknown_architecture_tokenizer_and_context(
    bucket: str, exports: dict[int, Path], tmp_path: Path
) -> None:
    no_weights = _upload(bucket, exports[1], skip=("model.safetensors",))
    done = _refused(no_weights, "--load-format", "runai_streamer")
    assert done.returncode == 1
    assert f"RuntimeError: Cannot find any safetensors model weights with `{no_weights}`" in done.stderr
    mistral = _copy(exports[1], tmp_path)
    config = json.loads((mistral / "config.json").read_text())
    (mistral / "config.json").write_text(json.dumps({**config, "architectures": ["MistralForCausalLM"]}))
    done = _refused(str(mistral))
    assert done.returncode == 1 and "Model architectures ['MistralForCausalLM'] are not supported" in done.stderr
    (tmp_path / "t").mkdir()
    no_tokenizer = _copy(exports[2], tmp_path / "t")
    (no_tokenizer / "tokenizer.json").unlink()
    done = _refused(str(no_tokenizer))
    assert done.returncode == 1 and "OSError: Can't load tokenizer for" in done.stderr, done.stderr
    done = _refused(str(exports[1]), "--max-model-len", "2048")  # the model has 256 positions
    assert done.returncode == 1
    assert "User-specified max_model_len (2048) is greater than the derived max_model_len" in done.stderr
    done = _refused(str(tmp_path / "nowhere"))
    assert done.returncode == 1 and "Invalid repository ID or local directory specified" in done.stderr


def _gauge(base: str, name: str) -> float:
    for line in requests.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_requests_beyond_max_num_seqs_wait_and_the_gauges_show_it(exports: dict[int, Path]) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, VLLM_STANDIN_SECONDS_PER_TOKEN="0.3")
    with running(standin_cmd(str(exports[1]), port, "--max-num-seqs", "1"), base, env=env):
        assert (_gauge(base, "vllm:num_requests_running"), _gauge(base, "vllm:num_requests_waiting")) == (0, 0)
        codes: list[int] = []
        threads = [
            threading.Thread(target=lambda: codes.append(_complete(base, "load", max_tokens=4).status_code))
            for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        seen = (0.0, 0.0)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and seen != (1.0, 2.0):
            seen = (_gauge(base, "vllm:num_requests_running"), _gauge(base, "vllm:num_requests_waiting"))
            time.sleep(0.05)
        assert seen == (1.0, 2.0)  # one in the batch, two queued: what the HPA reads
        for thread in threads:
            thread.join(timeout=30)
        assert codes == [200, 200, 200]
        assert _gauge(base, "vllm:num_requests_waiting") == 0
        assert _gauge(base, "vllm:request_success_total") == 3


def test_access_log_lines_and_sigterm_lets_the_request_in_flight_finish(exports: dict[int, Path]) -> None:
    """uvicorn's access log (vLLM's default) names each request; SIGTERM is graceful, as uvicorn's shutdown is."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, VLLM_STANDIN_SECONDS_PER_TOKEN="0.2")
    with running(standin_cmd(str(exports[1]), port), base, env=env) as proc:
        codes: list[int] = []
        slow = threading.Thread(target=lambda: codes.append(_complete(base, "slow", max_tokens=8).status_code))
        slow.start()
        time.sleep(0.5)  # in flight: up to 8 tokens take 1.6 s
        proc.terminate()
        slow.join(timeout=30)
        out, _ = proc.communicate(timeout=30)
    assert codes == [200]
    assert proc.returncode == 0
    assert out.count('"POST /v1/completions HTTP/1.1" 200 OK') == 1, out


def test_after_sigterm_a_busy_keep_alive_connection_closes_after_its_response(exports: dict[int, Path]) -> None:
    """uvicorn on shutdown: a keep-alive connection still carrying requests gets `Connection: close` with its next
    response, so a client (the Service proxy) reconnects to a replica still in the Service instead of feeding this
    one until the kubelet's SIGKILL cuts a request off."""
    import http.client

    port = free_port()
    with running(standin_cmd(str(exports[1]), port), f"http://127.0.0.1:{port}") as proc:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        body = json.dumps({"prompt": "x", "max_tokens": 1})
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/completions", body, headers)
        first = conn.getresponse()
        first.read()
        assert first.status == 200 and first.getheader("Connection") != "close"
        proc.terminate()
        time.sleep(0.5)
        conn.request("POST", "/v1/completions", body, headers)  # the same connection, after SIGTERM
        second = conn.getresponse()
        second.read()
        assert second.status == 200 and second.getheader("Connection") == "close"
        proc.wait(timeout=4)  # well before the 5 s keep-alive timeout: the connection closed with that response
    assert proc.returncode == 0


def test_a_mounted_export_reports_the_mount_path_the_pod_spec_names(exports: dict[int, Path]) -> None:
    """The local GKE runs a container with its mountPaths rewritten to host directories and names the pairs in
    INTERLUDE_VOLUME_MOUNTS; vLLM's root is the path it was given, so it must read /models/export, as on GKE."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, INTERLUDE_VOLUME_MOUNTS=json.dumps({str(exports[1]): "/models/export"}))
    with running(standin_cmd(str(exports[1]), port), base, env=env):
        assert requests.get(f"{base}/v1/models", timeout=10).json()["data"][0]["root"] == "/models/export"
