"""Stages that train: every stage's progress.json rewritten as a running workload rewrites it.

``triggerer_watch.py --gcs-state training`` runs this beside the triggerer. A workload rewrites its
progress.json about once a second (``Checkpointer(progress_seconds=1.0)``); a watcher polling every
``poll_interval`` sees a new generation of it at every poll, whatever the write rate above one per poll. So each
stage here is rewritten once per ``every`` seconds (the poll interval), evenly spread over it, with the
workload's own write path (``CheckpointStore.write_progress``, metadata copy included) and a payload shaped like
the SDK's, straight to the GCS emulator (not through the counting proxy: only the triggerer's calls are counted).
The writes it managed are counted, so a writer that fell behind shows in the figures instead of passing for
a calm bucket.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any


class ProgressWriter:
    """Rewrites ``run_keys``' ``stage`` progress once per ``every`` seconds each, in ``threads`` threads."""

    def __init__(
        self, gcs_endpoint: str, project: str, bucket: str, run_keys: list[str], every: float, threads: int = 6
    ) -> None:
        self.gcs_endpoint = gcs_endpoint
        self.project = project
        self.bucket = bucket
        self.run_keys = run_keys
        self.every = every
        self.threads = threads
        self.writes = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def start(self) -> ProgressWriter:
        t0 = time.monotonic()
        for k in range(self.threads):
            worker = threading.Thread(target=self._loop, args=(k, t0), name=f"progress-writer-{k}", daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=30)

    def _loop(self, k: int, t0: float) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        from interlude_workload.checkpoints import CheckpointStore

        client = storage.Client(
            project=self.project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.gcs_endpoint},
        )
        n = len(self.run_keys)
        mine = [
            (i, CheckpointStore(self.bucket, self.run_keys[i], "train", client=client))
            for i in range(k, n, self.threads)
        ]
        rnd = 0
        while not self._stop.is_set():
            for i, store in mine:
                wait = t0 + (rnd + i / n) * self.every - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    return
                try:
                    store.write_progress(_progress(self.run_keys[i], 1000 + rnd))
                except Exception:  # noqa: BLE001 - counted: a failed write is a stage that looked calm
                    with self._lock:
                        self.failures += 1
                    continue
                with self._lock:
                    self.writes += 1
            rnd += 1


def _progress(run_key: str, step: int) -> dict[str, Any]:
    """What ``Checkpointer._record_progress`` reports for a stage in mid-training."""
    now = time.time()
    return {
        "step": step,
        "total_steps": 1_000_000,
        "loss": round(1.0 / step, 6),
        "steps_per_second": 9.87,
        "eta_seconds": round((1_000_000 - step) / 9.87, 1),
        "mean_step_seconds": 0.101,
        "metrics": {},
        "state": "running",
        "boot_id": "bench-boot",
        "run_key": run_key,
        "stage": "train",
        "updated_at": datetime.fromtimestamp(now, UTC).isoformat(),
        "updated_at_epoch": now,
    }
