"""A vLLM STAND-IN (not vLLM): ``vllm_standin.py serve gs://BUCKET/EXPORT --load-format runai_streamer``.

It takes the ``vllm serve`` command line as vLLM parses it for the flags Interlude uses (an unknown flag:
argparse's "unrecognized arguments", exit 2), loads a Hugging Face model export the way vLLM does - from
``gs://`` with the Run:ai streamer (``STORAGE_EMULATOR_HOST`` honoured) or from a local directory such as a
Cloud Storage FUSE mount - and refuses what vLLM refuses with vLLM's exception and text, exit 1
(:mod:`standin_export`). It answers with the export's own greedy tokens: a numpy forward pass of the same
Llama architecture (:mod:`standin_model`), over the routes the GKE guide relies on (:mod:`standin_http`).

``VLLM_STANDIN_SECONDS_PER_TOKEN`` slows generation so requests queue (beyond ``--max-num-seqs``);
``VLLM_STANDIN_MAX_NUM_SEQS`` sets that flag's default (a saturated replica in a demo, the manifest
unchanged). Flags: https://docs.vllm.ai/en/v0.11.0/cli/serve.html . See README.md beside this file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, however it is started
# One BLAS thread: a completion of this model is a few milliseconds of small matmuls, and OpenBLAS's pool spins
# its threads between calls (measured: 10 ms of CPU for 5 ms of wall), which a node full of pods cannot spare.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

MAX_NUM_SEQS_ENV = "VLLM_STANDIN_MAX_NUM_SEQS"


def build_parser() -> argparse.ArgumentParser:
    """vLLM's `serve` flags that Interlude renders or tests use (plugins/interlude/serving/vllm_serve_flags.yaml)."""
    parser = argparse.ArgumentParser(prog="vllm", description="vLLM stand-in (Interlude's local cloud)")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="Start the OpenAI-compatible API server (stand-in)", allow_abbrev=False)
    serve.add_argument("model_tag", nargs="?", default=None, help="the model: gs://BUCKET/EXPORT or a directory")
    serve.add_argument("--model", default=None)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--served-model-name", nargs="+", default=None)
    serve.add_argument("--download-dir", default=None)
    # LoadConfig.load_format is `str | LoadFormats`: any string parses; an unregistered one fails at load time
    serve.add_argument("--load-format", default="auto", metavar="LOAD_FORMAT")
    serve.add_argument("--model-loader-extra-config", type=json.loads, default=None)
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
    checks = (
        (args.tensor_parallel_size >= 1, "--tensor-parallel-size must be >= 1"),
        (0.0 < args.gpu_memory_utilization <= 1.0, "--gpu-memory-utilization must be in (0, 1]"),
        (args.max_num_seqs >= 1 and (args.max_model_len or 1) >= 1, "--max-num-seqs and --max-model-len must be >= 1"),
        (1 <= args.port <= 65535, "--port must be 1..65535"),
    )
    for ok, message in checks:
        if not ok:
            parser.error(message)
    args.served_model_name = args.served_model_name or [args.model]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)  # heavy imports wait until the flags are accepted, so a bad flag fails fast
    from standin_export import VllmStartupError
    from standin_http import Server
    from standin_model import load_model

    print(f"INFO vLLM STAND-IN (not vLLM) loading {args.model} (load format {args.load_format})", flush=True)
    try:
        model = load_model(args.model, args.load_format, args.max_model_len)
    except VllmStartupError as exc:  # vLLM's engine start fails: its traceback ends with this line, exit 1
        print(f"ERROR {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - e.g. the bucket is not there: the streamer's client error
        print(f"ERROR {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    server = Server(args, model)
    print(
        f"INFO loaded {model.uri}: {len(model.weights)} tensors, weights sha256 {model.weights_sha256}, "
        f"max_model_len {model.max_model_len}",
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
