"""The vLLM stand-in as a real process against a real checkpoint in the GCS emulator."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from google.cloud import storage

from interlude_workload.gcs import storage_client
from interlude_workload.testing import free_port

from .standin_proc import STANDIN, running, standin_cmd, write_checkpoint


def _manifest_sha256(uri: str) -> str:
    """Independent of the stand-in: sha256 of manifest.json as stored in GCS."""
    bucket, prefix = uri[len("gs://") :].split("/", 1)
    blob = storage.Blob(prefix + "manifest.json", storage_client().bucket(bucket))
    return hashlib.sha256(blob.download_as_bytes()).hexdigest()


def _first_token(params: dict[str, np.ndarray], prompt: bytes) -> str:
    """The reference model's greedy class on the prompt's folded bytes, computed here from the weights."""
    features = np.zeros(params["w1"].shape[0])
    for i, byte in enumerate(prompt):
        features[i % len(features)] += (byte - 96.0) / 32.0
    features /= max(1.0, np.ceil(len(prompt) / len(features)))
    logits = np.tanh(features @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    vocab = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
    return vocab[(int(np.argmax(probs)) + 3 * int(probs.max() * 1000)) % len(vocab)]


def _complete(base: str, prompt: str, **body: object) -> requests.Response:
    return requests.post(f"{base}/v1/completions", json={"prompt": prompt, **body}, timeout=30)


def test_serves_the_committed_checkpoint_openai_style(bucket: str, tmp_path: Path) -> None:
    uri_a, params_a = write_checkpoint(bucket, "serve", 10, seed=1)
    uri_b, _ = write_checkpoint(bucket, "serve", 20, seed=2)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    prompts = ["Write a story about san francisco", "zzz", "The quick brown fox"]
    cmd = standin_cmd(
        uri_a,
        port,
        "--served-model-name",
        "interlude-mlp",
        "--max-model-len",
        "256",
        "--tensor-parallel-size",
        "1",
        "--gpu-memory-utilization",
        "0.9",
        "--max-num-seqs",
        "4",
        "--disable-log-requests",
        "--download-dir",
        str(tmp_path / "cache"),
    )
    with running(cmd, base):
        models = requests.get(f"{base}/v1/models", timeout=10).json()
        assert models["object"] == "list"
        assert [(m["id"], m["root"], m["max_model_len"]) for m in models["data"]] == [("interlude-mlp", uri_a, 256)]
        first = _complete(base, prompts[0], model="interlude-mlp", max_tokens=5, temperature=0).json()
        assert first["object"] == "text_completion" and first["model"] == "interlude-mlp"
        assert first["system_fingerprint"] == "ckpt-" + _manifest_sha256(uri_a)[:16]
        [choice] = first["choices"]
        assert choice["finish_reason"] == "length" and len(choice["text"].split()) == 5
        assert choice["text"].split()[0] == _first_token(params_a, prompts[0].encode())
        assert first["usage"]["completion_tokens"] == 5
        texts_a = [_complete(base, p, max_tokens=6).json()["choices"][0]["text"] for p in prompts]
        assert _complete(base, prompts[0], model="interlude-mlp", max_tokens=5).json()["choices"] == first["choices"]
        batch = requests.post(f"{base}/v1/completions", json={"prompt": prompts, "max_tokens": 6}, timeout=30).json()
        assert [c["text"] for c in batch["choices"]] == texts_a
        wrong = _complete(base, "x", model="other")
        assert wrong.status_code == 404 and wrong.json()["type"] == "NotFoundError"
        too_long = _complete(base, "x" * 250, max_tokens=10)
        assert too_long.status_code == 400 and "maximum context length is 256" in too_long.json()["message"]
        assert requests.get(f"{base}/nope", timeout=10).status_code == 404
    copied = {p.name for p in (tmp_path / "cache" / bucket).rglob("*") if p.is_file()}
    assert copied == {"arrays.npz", "state.json"}  # --download-dir keeps the verified payload
    # the newest checkpoint of the stage, asked for by stage prefix: another fingerprint, other answers
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    stage_uri = uri_a.rsplit("step-", 1)[0]
    with running(standin_cmd(stage_uri, port, "--max-model-len", "256"), base) as proc:
        other = _complete(base, prompts[0], max_tokens=5).json()
        assert other["system_fingerprint"] == "ckpt-" + _manifest_sha256(uri_b)[:16]
        assert requests.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"] == stage_uri
        texts_b = [_complete(base, p, max_tokens=6).json()["choices"][0]["text"] for p in prompts]
        assert texts_b != texts_a
        assert len({t for text in texts_a + texts_b for t in text.split()}) >= 4  # not a constant answer
        proc.terminate()
        assert proc.wait(timeout=20) == 0  # SIGTERM: clean shutdown


def _gauge(base: str, name: str) -> float:
    for line in requests.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_requests_beyond_max_num_seqs_wait_and_the_gauges_show_it(bucket: str) -> None:
    uri, _ = write_checkpoint(bucket, "load", 5, seed=3)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, VLLM_STANDIN_SECONDS_PER_TOKEN="0.3")
    with running(standin_cmd(uri, port, "--max-num-seqs", "1"), base, env=env):
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus", "1"], "unrecognized arguments: --bogus 1"),
        (["--max-num-seqs", "many"], "invalid int value"),
        (["--gpu-memory-utilization", "1.5"], "must be in (0, 1]"),
    ],
)
def test_flags_are_checked_like_vllm(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, str(STANDIN), "serve", "gs://bkt/interlude/run/finetune/", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr


def test_missing_checkpoint_fails_with_a_reason(bucket: str) -> None:
    done = subprocess.run(
        [sys.executable, str(STANDIN), "serve", f"gs://{bucket}/interlude/none/finetune/step-00000001/"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "no committed checkpoint" in done.stderr


def test_access_log_lines_and_sigterm_lets_the_request_in_flight_finish(bucket: str) -> None:
    """uvicorn's access log (vLLM's default) names each request; SIGTERM is graceful, as uvicorn's shutdown is."""
    uri, _ = write_checkpoint(bucket, "graceful", 5, seed=4)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ, VLLM_STANDIN_SECONDS_PER_TOKEN="0.2")
    with running(standin_cmd(uri, port), base, env=env) as proc:
        codes: list[int] = []
        slow = threading.Thread(target=lambda: codes.append(_complete(base, "slow", max_tokens=8).status_code))
        slow.start()
        time.sleep(0.5)  # in flight: 8 tokens take 1.6 s
        proc.terminate()
        slow.join(timeout=30)
        out, _ = proc.communicate(timeout=30)
    assert codes == [200]
    assert proc.returncode == 0
    assert out.count('"POST /v1/completions HTTP/1.1" 200 OK') == 1, out


def test_after_sigterm_a_busy_keep_alive_connection_closes_after_its_response(bucket: str) -> None:
    """uvicorn on shutdown: a keep-alive connection still carrying requests gets `Connection: close` with its next
    response, so a client (the Service proxy) reconnects to a replica still in the Service instead of feeding this
    one until the kubelet's SIGKILL cuts a request off."""
    import http.client

    uri, _ = write_checkpoint(bucket, "closing", 5, seed=6)
    port = free_port()
    with running(standin_cmd(uri, port), f"http://127.0.0.1:{port}") as proc:
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
