"""Notice-to-committed and restore time of the reference trainer on a slice of 1, 2 and 4 worker processes.

For each worker count N: N trainer processes (the tiny model, data-parallel over ``jax.distributed`` with gloo on
loopback; one process without it) train on a local GCS emulator, each worker watching a metadata server of its own
(served here, as each TPU VM of a slice has its own). Then:

* **notice -> committed**: the last worker's ``instance/maintenance-event`` turns TERMINATE_ON_HOST_MAINTENANCE;
  the time until a new step is finalised in GCS (Orbax's ``commit_success.txt``, polled every 10 ms from here) -
  every worker must agree on and save that step;
* the slice goes down (SIGTERM to every worker; they are holding at a committed step) and comes back:
  **restore** is the time from starting the N new processes to the last worker's "training ... steps" line (the
  process start, JAX, ``jax.distributed.initialize``, Orbax's restore of the committed step);
* **recomputed**: steps the new boot trained again (its resume point against the last step the old one reached).

Figures are wall-clock on this machine (2 cores, shared): N workers share the cores, so the times grow with N here
for reasons a real slice (one host per worker) does not have.

    .venv/bin/python benchmarks/multihost_restore.py [--workers 1,2,4] [--repeat 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.testing import free_port, running_gcs_emulator

TRAINING = re.compile(r"training train steps (\d+)\.\.")
HELD = re.compile(r"holding at committed step (\d+)")


class Metadata:
    """Each worker's ``instance/maintenance-event`` (long-polled with ``wait_for_change`` and an ETag, as Google's
    metadata server does); the other watched keys say nothing is coming. ``attributes[worker]`` are its
    ``instance/attributes/`` (a TPU VM's ``agent-worker-number``, ``worker-network-endpoints``); others are 404."""

    def __init__(self) -> None:
        self.events: dict[str, str] = {}
        self.attributes: dict[str, dict[str, str]] = {}
        self.changed = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, worker: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{worker}/computeMetadata/v1"

    def announce(self, worker: str, event: str) -> None:
        with self.changed:
            self.events[worker] = event
            self.changed.notify_all()

    def body(self, worker: str, path: str, query: dict[str, list[str]]) -> str | None:
        """What ``worker``'s metadata server answers for ``path`` (None: 404), after a long poll's wait."""
        if path == "instance/maintenance-event":
            return self._wait(worker, query)
        if path == "instance/upcoming-maintenance":
            return self._hold(query, "{}")
        if path == "instance/preempted":
            return self._hold(query, "FALSE")
        return (
            self.attributes.get(worker, {}).get(path.removeprefix("instance/attributes/"))
            if "attributes/" in path
            else None
        )

    def _wait(self, worker: str, query: dict[str, list[str]]) -> str:
        timeout = float(query.get("timeout_sec", ["60"])[0])
        last = query.get("last_etag", [None])[0]
        with self.changed:
            self.changed.wait_for(
                lambda: etag(self.events.get(worker, "NONE")) != last or "wait_for_change" not in query,
                timeout=timeout,
            )
            return self.events.get(worker, "NONE")

    @staticmethod
    def _hold(query: dict[str, list[str]], body: str) -> str:
        if "wait_for_change" in query and query.get("last_etag", [None])[0] == etag(body):
            time.sleep(min(float(query.get("timeout_sec", ["60"])[0]), 5.0))
        return body

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        metadata = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                worker, _, path = url.path.strip("/").partition("/computeMetadata/v1/")
                body = metadata.body(worker, path, parse_qs(url.query))
                try:
                    if body is None:
                        self.send_error(404)
                        return
                    data = body.encode()
                    self.send_response(200)
                    self.send_header("ETag", etag(body))
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the watcher's process ended while its long poll was open

        return Handler


def etag(body: str) -> str:
    return str(abs(hash(body)))


def _commands(bucket: str, run_key: str, workers: int, metadata: Metadata) -> list[tuple[list[str], dict[str, str]]]:
    coordinator = f"127.0.0.1:{free_port()}"
    base = [sys.executable, "-m", "interlude_workload.train", "--bucket", bucket, "--run-key", run_key]
    base += ["--stage", "train", "--steps", "1000000", "--checkpoint-every", "100000", "--model-size", "tiny"]
    base += ["--step-seconds", "0.05", "--hold-margin-seconds", "0"]
    out = []
    for index in range(workers):
        flags = ["--num-workers", str(workers), "--worker-id", str(index), "--coordinator", coordinator]
        env = {**os.environ, "INTERLUDE_METADATA_URL": metadata.url(f"{run_key}-w{index}")}
        out.append((base + (flags if workers > 1 else []), env))
    return out


def _start(commands: list[tuple[list[str], dict[str, str]]], logs: list[Path]) -> list[subprocess.Popen[bytes]]:
    procs = []
    for (cmd, env), log in zip(commands, logs, strict=True):
        with log.open("ab") as handle:
            procs.append(subprocess.Popen(cmd, env=env, stdout=handle, stderr=subprocess.STDOUT))
    return procs


def _wait_for(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.01)
    raise TimeoutError(f"{what} not within {timeout:.0f}s")


def _text(log: Path, mark: int = 0) -> str:
    return log.read_text(errors="replace")[mark:]


def measure(workers: int, bucket: str, metadata: Metadata, tmp: Path, repeat: int) -> dict[str, Any]:
    run_key = f"n{workers}-{repeat}"
    store = CheckpointStore(bucket, run_key, "train")
    logs = [tmp / f"{run_key}-w{index}.log" for index in range(workers)]
    procs = _start(_commands(bucket, run_key, workers, metadata), logs)
    try:
        _wait_for(lambda: all("step 20/" in _text(log) for log in logs), 300, "step 20 on every worker")
        noticed = time.monotonic()
        metadata.announce(f"{run_key}-w{workers - 1}", "TERMINATE_ON_HOST_MAINTENANCE")
        committed = _wait_for(lambda: store.latest().checkpoint, 120, "a committed step")
        notice_to_commit = time.monotonic() - noticed
        _wait_for(lambda: all("holding at committed step" in _text(log) for log in logs), 120, "every worker held")
        reached = max(int(m) for log in logs for m in HELD.findall(_text(log)))
        for proc in procs:
            proc.send_signal(signal.SIGTERM)  # the slice goes down for its maintenance
        codes = [proc.wait(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    metadata.announce(f"{run_key}-w{workers - 1}", "NONE")
    marks = [len(_text(log)) for log in logs]
    started = time.monotonic()
    procs = _start(_commands(bucket, run_key, workers, metadata), logs)
    try:
        resumed = _wait_for(
            lambda: (
                [TRAINING.search(_text(log, mark)) for log, mark in zip(logs, marks, strict=True)]
                if all(TRAINING.search(_text(log, mark)) for log, mark in zip(logs, marks, strict=True))
                else None
            ),
            300,
            "every worker training again",
        )
        restore = time.monotonic() - started
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    resume_step = int(resumed[0].group(1)) - 1
    return {
        "workers": workers,
        "notice_to_committed_s": round(notice_to_commit, 3),
        "committed_step": committed.step,
        "restore_s": round(restore, 3),
        "recomputed_steps": max(reached - resume_step, 0),
        "exit_codes": codes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--workers",
        default="1,2,4",
        help="worker counts (the tiny model's 4 rows split up to 4 ways; more workers replicate)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    counts = [int(value) for value in args.workers.split(",")]
    rows = []
    with (
        running_gcs_emulator() as emulator,
        tempfile.TemporaryDirectory(dir=os.environ.get("MULTIHOST_LOG_DIR")) as tmp,
    ):
        os.environ["STORAGE_EMULATOR_HOST"] = emulator.endpoint
        bucket = "multihost-restore"
        emulator.create_bucket(bucket)
        metadata = Metadata()
        for repeat in range(args.repeat):
            for workers in counts:
                rows.append(measure(workers, bucket, metadata, Path(tmp), repeat))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'workers':>7} {'notice->committed s':>20} {'restore s':>10} {'recomputed':>10}")
    for workers in counts:
        mine = [row for row in rows if row["workers"] == workers]
        notice = statistics.median(row["notice_to_committed_s"] for row in mine)
        restore = statistics.median(row["restore_s"] for row in mine)
        recomputed = max(row["recomputed_steps"] for row in mine)
        print(f"{workers:>7} {notice:>20.3f} {restore:>10.3f} {recomputed:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
