"""A vLLM STAND-IN (not vLLM): ``python include/serving/vllm_standin.py serve gs://B/interlude/RUN/STAGE/step-N/``.

It takes the ``vllm serve`` flags Interlude passes and refuses others as vLLM's argparse does (exit 2,
"unrecognized arguments"), loads Interlude's reference model from a committed checkpoint in GCS (through
the workload's checkpoint store, so ``STORAGE_EMULATOR_HOST`` works) and serves the routes the GKE guide
relies on: ``/health``, ``/v1/models``, ``/v1/completions`` (OpenAI JSON) and ``/metrics`` (Prometheus
text, with ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``, the HPA's signal).

Answers are deterministic: greedy "tokens" from the model's output on the prompt's bytes, and the
checkpoint's manifest digest as ``system_fingerprint``, so a test can tell which checkpoint is served.
``VLLM_STANDIN_SECONDS_PER_TOKEN`` slows generation so requests queue (beyond ``--max-num-seqs``) and the
waiting gauge moves; ``VLLM_STANDIN_MAX_NUM_SEQS`` sets that flag's default (a saturated replica in a demo, with
the manifest unchanged). Flags: https://docs.vllm.ai/en/latest/cli/serve/ . See README.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # heavy imports wait until the flags are accepted, so a bad flag fails fast
    import numpy as np

    from interlude_workload.checkpoints import Checkpoint

VOCAB = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")
_URI = re.compile(
    r"^gs://([a-z0-9][a-z0-9._-]{1,220})/interlude/([a-z][a-z0-9_-]{0,62})/([a-z][a-z0-9_-]{0,62})/(?:step-(\d{8,})/?)?$"
)
SECONDS_PER_TOKEN_ENV = "VLLM_STANDIN_SECONDS_PER_TOKEN"
MAX_NUM_SEQS_ENV = "VLLM_STANDIN_MAX_NUM_SEQS"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm", description="vLLM stand-in (Interlude's local cloud)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Start the OpenAI-compatible API server (stand-in)")
    serve.add_argument("model_tag", nargs="?", default=None, help="checkpoint URI gs://.../STAGE/[step-N/]")
    serve.add_argument("--model", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--max-model-len", type=int, default=2048)
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--download-dir", default=None)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--max-num-seqs", type=int, default=int(os.environ.get(MAX_NUM_SEQS_ENV) or 256))
    serve.add_argument("--disable-log-requests", action=argparse.BooleanOptionalAction, default=True)
    serve.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False)
    serve.add_argument("--disable-uvicorn-access-log", action="store_true", default=False)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.model = args.model_tag or args.model
    if not args.model:
        parser.error("a model is required: vllm serve MODEL or --model MODEL")
    if not _URI.match(args.model):
        parser.error(
            f"model {args.model!r} is not an Interlude checkpoint URI gs://BUCKET/interlude/RUN/STAGE/[step-N/]"
        )
    checks = (
        (args.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1"),
        (0.0 < args.gpu_memory_utilization <= 1.0, "--gpu-memory-utilization must be in (0, 1]"),
        (args.max_num_seqs >= 1 and args.max_model_len >= 1, "--max-num-seqs and --max-model-len must be >= 1"),
        (1 <= args.port <= 65535, "--port must be 1..65535"),
    )
    for ok, message in checks:
        if not ok:
            parser.error(message)
    args.served_model_name = args.served_model_name or [args.model]
    return args


# ----------------------------------------------------------------- the model
@dataclass(frozen=True)
class LoadedModel:
    uri: str
    step: int
    manifest_sha256: str  # the COMMITTED marker: sha256 of manifest.json
    weights_sha256: str
    params: dict[str, np.ndarray]

    def next_token(self, text: bytes) -> int:
        """Greedy pick from the model's output on a feature vector folded from the bytes: the predicted
        class and its probability in thousandths, so any change of weights shows in the text."""
        import numpy as np

        w1 = self.params["w1"]
        features = np.zeros(w1.shape[0])
        for i, byte in enumerate(text):
            features[i % len(features)] += (byte - 96.0) / 32.0
        features /= max(1.0, np.ceil(len(text) / len(features)))
        hidden = np.tanh(features @ w1 + self.params["b1"])
        logits = hidden @ self.params["w2"] + self.params["b2"]
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        return int(np.argmax(probs)) + 3 * int(probs.max() * 1000)

    def generate(self, prompt: str, max_tokens: int, pace: float) -> list[str]:
        text = prompt.encode()
        tokens: list[str] = []
        for _ in range(max_tokens):
            token = VOCAB[self.next_token(text) % len(VOCAB)]
            tokens.append(token)
            text += b" " + token.encode()
            if pace > 0:
                time.sleep(pace)
        return tokens


def load_model(uri: str, download_dir: str | None = None) -> LoadedModel:
    """Verify and load the checkpoint (sha256 of every payload file) through the workload's store."""
    from interlude_workload.checkpoints import COMMITTED, CheckpointStore, StepStatus
    from interlude_workload.sdk import decode_payload, weights_digest

    class _OneStep(CheckpointStore):
        """The store limited to one step, so ``restore()`` verifies and loads exactly that step."""

        def __init__(self, bucket: str, run_key: str, stage: str, step: int) -> None:
            super().__init__(bucket, run_key, stage)
            self.only_step = step

        def scan(self) -> list[StepStatus]:
            return [s for s in super().scan() if s.step == self.only_step]

    match = _URI.match(uri)
    if match is None:
        raise ValueError(f"not a checkpoint URI: {uri}")
    bucket, run_key, stage, step = match.groups()
    store = CheckpointStore(bucket, run_key, stage) if step is None else _OneStep(bucket, run_key, stage, int(step))
    checkpoint, files, rejected = store.restore()
    if checkpoint is None:
        reasons = "; ".join(f"step {r.step}: {r.reason}" for r in rejected) or "no committed checkpoint"
        raise RuntimeError(f"cannot load {uri}: {reasons}")
    marker = store.bucket.blob(checkpoint.prefix + COMMITTED).download_as_bytes().decode("ascii").strip()
    arrays, _state = decode_payload(files)
    params = {name[len("param_") :]: value for name, value in arrays.items() if name.startswith("param_")}
    if set(params) != {"w1", "b1", "w2", "b2"}:
        raise RuntimeError(f"{checkpoint.uri} is not the reference model (params {sorted(params)})")
    if download_dir:
        _keep_copy(Path(download_dir), checkpoint, files)
    return LoadedModel(checkpoint.uri, checkpoint.step, marker, weights_digest(params), params)


def _keep_copy(root: Path, checkpoint: Checkpoint, files: dict[str, bytes]) -> None:
    target = root / checkpoint.bucket / checkpoint.prefix
    target.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (target / name).write_bytes(data)


# ----------------------------------------------------------------- metrics
class Metrics:
    """The vLLM metric names the HPA and dashboards use; prometheus_client when installed."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.lock = threading.Lock()
        self.values = {"running": 0, "waiting": 0, "success": 0, "prompt": 0, "generation": 0}

    def add(self, key: str, delta: int) -> None:
        with self.lock:
            self.values[key] += delta

    def render(self) -> tuple[bytes, str]:
        with self.lock:
            values = dict(self.values)
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
        except ImportError:
            return self._render_text(values), "text/plain; version=0.0.4; charset=utf-8"
        registry = CollectorRegistry()
        label = {"model_name": self.model_name}
        for name, doc, key in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
        ):
            Gauge(name, doc, ["model_name"], registry=registry).labels(**label).set(values[key])
        for name, doc, key in (
            ("vllm:request_success", "Count of successfully processed requests.", "success"),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", "prompt"),
            ("vllm:generation_tokens", "Number of generation tokens processed.", "generation"),
        ):
            Counter(name, doc, ["model_name"], registry=registry).labels(**label).inc(values[key])
        return generate_latest(registry), "text/plain; version=0.0.4; charset=utf-8"

    def _render_text(self, values: dict[str, int]) -> bytes:
        label = '{model_name="' + self.model_name.replace("\\", "\\\\").replace('"', '\\"') + '"}'
        lines = []
        for name, kind, key in (
            ("vllm:num_requests_running", "gauge", "running"),
            ("vllm:num_requests_waiting", "gauge", "waiting"),
            ("vllm:request_success_total", "counter", "success"),
            ("vllm:prompt_tokens_total", "counter", "prompt"),
            ("vllm:generation_tokens_total", "counter", "generation"),
        ):
            lines += [f"# TYPE {name} {kind}", f"{name}{label} {float(values[key])}"]
        return ("\n".join(lines) + "\n").encode()


# ----------------------------------------------------------------- HTTP
class Server(ThreadingHTTPServer):
    # Like uvicorn on SIGTERM: stop accepting, let the requests in flight finish (server_close joins them).
    daemon_threads = False
    block_on_close = True
    request_queue_size = 2048  # uvicorn's default backlog (socketserver's 5 resets bursts of clients)

    def __init__(self, args: argparse.Namespace, model: LoadedModel) -> None:
        self.args = args
        self.model = model
        self.names = list(args.served_model_name)
        self.metrics = Metrics(self.names[0])
        self.slots = threading.BoundedSemaphore(args.max_num_seqs)
        self.pace = float(os.environ.get(SECONDS_PER_TOKEN_ENV, "0") or 0)
        self.started = int(time.time())
        self.stopping = threading.Event()  # set on SIGTERM: every response from then on closes its connection
        super().__init__((args.host, args.port), Handler)


def _error(status: int, kind: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"object": "error", "message": message, "type": kind, "param": None, "code": status}


class Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    timeout = 5  # an idle keep-alive connection closes after 5 s, as uvicorn's --timeout-keep-alive default

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """uvicorn's access log line, which vLLM prints for every request unless --disable-uvicorn-access-log."""
        if self.server.args.disable_uvicorn_access_log:
            return
        status = int(code) if str(code).isdigit() else 0
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        host, port = self.client_address[:2]
        sys.stdout.write(f'INFO:     {host}:{port} - "{self.requestline}" {code} {phrase}\n')
        sys.stdout.flush()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.args.enable_log_requests or not self.server.args.disable_log_requests:
            sys.stderr.write(f"INFO {self.address_string()} {format % args}\n")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if self.server.stopping.is_set():
            # uvicorn on shutdown: a busy keep-alive connection closes after its response, so the client's next
            # request goes out on a new connection (to a replica still in the Service) instead of to this one.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200, b"", "application/json")
        elif path == "/metrics":
            self._send(200, *self.server.metrics.render())
        elif path == "/v1/models":
            self._json(200, self._models())
        elif path == "/version":
            self._json(200, {"version": "interlude-standin"})
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != "/v1/completions":
            self._json(404, {"detail": "Not Found"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(*_error(400, "BadRequestError", "the body is not JSON"))
            return
        self._json(*self._complete(request if isinstance(request, dict) else {}))

    def _models(self) -> dict[str, Any]:
        model = self.server.model
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": self.server.started,
                    "owned_by": "vllm",
                    "root": model.uri,
                    "parent": None,
                    "max_model_len": self.server.args.max_model_len,
                }
                for name in self.server.names
            ],
        }

    def _complete(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = request.get("model", self.server.names[0])
        if name not in self.server.names:
            return _error(404, "NotFoundError", f"The model `{name}` does not exist.")
        prompts = request.get("prompt")
        prompts = [prompts] if isinstance(prompts, str) else prompts
        max_tokens = request.get("max_tokens", 16)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            return _error(400, "BadRequestError", "prompt must be a string or a list of strings")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "BadRequestError", "max_tokens must be a positive integer")
        longest = max(len(p.encode()) for p in prompts)
        if longest + max_tokens > self.server.args.max_model_len:
            return _error(
                400,
                "BadRequestError",
                f"This model's maximum context length is {self.server.args.max_model_len} tokens. However, you "
                f"requested {longest + max_tokens} tokens ({longest} in the messages, {max_tokens} in the "
                "completion).",
            )
        choices = self._generate(prompts, max_tokens)
        prompt_tokens = sum(len(p.encode()) for p in prompts)
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
            "system_fingerprint": f"ckpt-{self.server.model.manifest_sha256[:16]}",
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens * len(prompts),
                "total_tokens": prompt_tokens + max_tokens * len(prompts),
            },
        }

    def _generate(self, prompts: list[str], max_tokens: int) -> list[dict[str, Any]]:
        metrics = self.server.metrics
        metrics.add("waiting", 1)
        with self.server.slots:  # beyond --max-num-seqs, requests wait here (vllm:num_requests_waiting)
            metrics.add("waiting", -1)
            metrics.add("running", 1)
            try:
                texts = [" " + " ".join(self.server.model.generate(p, max_tokens, self.server.pace)) for p in prompts]
            finally:
                metrics.add("running", -1)
        metrics.add("success", 1)
        metrics.add("prompt", sum(len(p.encode()) for p in prompts))
        metrics.add("generation", max_tokens * len(prompts))
        return [
            {"index": i, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None}
            for i, text in enumerate(texts)
        ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"INFO vLLM STAND-IN (not vLLM) loading {args.model} (tp={args.tensor_parallel_size})", flush=True)
    try:
        model = load_model(args.model, args.download_dir)
    except (RuntimeError, ValueError) as exc:
        print(f"ERROR {exc}", file=sys.stderr, flush=True)
        return 1
    server = Server(args, model)
    print(
        f"INFO loaded step {model.step} manifest sha256 {model.manifest_sha256} weights {model.weights_sha256}",
        flush=True,
    )
    for route in ("/health", "/v1/models", "/v1/completions", "/metrics"):
        print(f"INFO Route: {route}", flush=True)

    def stop(signum: int, frame: object) -> None:
        server.stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"INFO Uvicorn-compatible stand-in running on http://{host}:{port} (Press CTRL+C to quit)", flush=True)
    server.serve_forever()
    server.server_close()
    print("INFO stand-in stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
