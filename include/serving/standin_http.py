"""The vLLM stand-in's HTTP side: the routes Google's GKE guide and the HPA use, vLLM's answers and metrics.

``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` (OpenAI JSON: ``prompt`` string or list,
``max_tokens`` (default 16, as vLLM's), ``model``; vLLM's error bodies for an unknown model or a too-long
request), ``GET /metrics`` (Prometheus text: ``vllm:num_requests_running``/``waiting`` - the HPA's signal -,
``vllm:request_success_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``). At most
``--max-num-seqs`` requests run at once; the rest wait and show in ``vllm:num_requests_waiting``.
``system_fingerprint`` is ``fp_`` + the first 16 hex digits of the sha256 of the served weight files, so a
test can tell which export a replica serves (real vLLM sends none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standin_model import Completion, ServedModel

SECONDS_PER_TOKEN_ENV = "VLLM_STANDIN_SECONDS_PER_TOKEN"
DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
MOUNTS_ENV = "INTERLUDE_VOLUME_MOUNTS"  # set by the local GKE's kubelet (interlude_localcloud.gke.gcsfuse)


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

    def __init__(self, args: argparse.Namespace, model: ServedModel) -> None:
        self.args = args
        self.model = model
        self.names = list(args.served_model_name)
        self.metrics = Metrics(self.names[0])
        self.slots = threading.BoundedSemaphore(args.max_num_seqs)
        self.pace = float(os.environ.get(SECONDS_PER_TOKEN_ENV, "0") or 0)
        self.started = int(time.time())
        self.root = spec_path(model.uri)
        self.stopping = threading.Event()  # set on SIGTERM: every response from then on closes its connection
        super().__init__((args.host, args.port), Handler)


def spec_path(path: str) -> str:
    """The path as the pod spec names it: the local GKE runs a container with its mountPaths rewritten to host
    directories and says which is which in INTERLUDE_VOLUME_MOUNTS (JSON {host directory: mountPath}); vLLM
    reports the model path it was given, so /v1/models shows the mountPath, as on GKE."""
    mounts = json.loads(os.environ.get(MOUNTS_ENV) or "{}")
    for host, mount_path in sorted(mounts.items(), key=lambda item: -len(item[0])):
        host = host.rstrip("/")
        if path == host or path.startswith(host + "/"):
            return mount_path.rstrip("/") + path[len(host) :]
    return path


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
                    "root": self.server.root,
                    "parent": None,
                    "max_model_len": model.max_model_len,
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
        max_tokens = request.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            return _error(400, "BadRequestError", "prompt must be a string or a list of strings")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "BadRequestError", "max_tokens must be a positive integer")
        encoded = [self.server.model.encode(p) for p in prompts]
        longest = max(len(ids) for ids in encoded)
        limit = self.server.model.max_model_len
        if longest + max_tokens > limit:
            return _error(
                400,
                "BadRequestError",
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{longest + max_tokens} tokens ({longest} in the messages, {max_tokens} in the completion). "
                "Please reduce the length of the messages or completion.",
            )
        done = self._generate(encoded, max_tokens)
        prompt_tokens = sum(c.prompt_tokens for c in done)
        completion_tokens = sum(len(c.token_ids) for c in done)
        return 200, {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
            "system_fingerprint": f"fp_{self.server.model.weights_sha256[:16]}",
            "choices": [
                {"index": i, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason, "stop_reason": None}
                for i, c in enumerate(done)
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def _generate(self, encoded: list[list[int]], max_tokens: int) -> list[Completion]:
        metrics = self.server.metrics
        metrics.add("waiting", 1)
        with self.server.slots:  # beyond --max-num-seqs, requests wait here (vllm:num_requests_waiting)
            metrics.add("waiting", -1)
            metrics.add("running", 1)
            try:
                done = [self.server.model.complete(ids, max_tokens, self.server.pace) for ids in encoded]
            finally:
                metrics.add("running", -1)
        metrics.add("success", 1)
        metrics.add("prompt", sum(c.prompt_tokens for c in done))
        metrics.add("generation", sum(len(c.token_ids) for c in done))
        return done
