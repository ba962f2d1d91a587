"""The Checkpointer's reporting: its log (stdout and GCS chunks) and progress.json, kept apart from the checkpoint
logic it reports on (interlude_workload.sdk). A mixin: it uses the Checkpointer's lock, store and state."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from interlude_workload.stage_files import now_iso

LOG_CHUNK_BYTES = 64 * 1024


class ProgressReporting:
    """Log lines and progress of one Checkpointer (see interlude_workload.sdk.Checkpointer for the attributes)."""

    store: Any
    workers: Any
    total_steps: int
    progress_seconds: float
    _lock: Any
    _closing: Any
    _flush_lock: Any
    _log_buffer: list[str]
    _log_seq: int
    _chunk_lines: list[str]
    _writer_id: str
    _progress: dict[str, Any]
    _progress_dirty: bool
    _rate_window: list[tuple[float, int]]
    _first_step: tuple[float, int] | None

    def log(self, message: str) -> None:
        worker = f" w{self.workers.index}" if self.workers.multi else ""
        line = f"{now_iso()} [{self.store.run_key}/{self.store.stage}{worker}] {message}"
        with self._lock:
            self._log_buffer.append(line)
            try:  # one write per line: threads must not interleave; a dead console must not stop training
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
            except (OSError, ValueError):
                pass

    def _record_progress(self, step: int, loss: float | None, metrics: Mapping[str, Any]) -> None:
        now = time.monotonic()
        if self._first_step is None:
            self._first_step = (now, step - 1)
        t_first, s_first = self._first_step
        mean = (now - t_first) / (step - s_first) if step > s_first else None
        self._rate_window.append((now, step))
        self._rate_window = [(t, s) for t, s in self._rate_window if now - t <= 10.0] or [(now, step)]
        t0, s0 = self._rate_window[0]
        rate = (step - s0) / (now - t0) if now > t0 and step > s0 else None
        eta = (self.total_steps - step) / rate if rate else None
        self._set_progress(
            step=step,
            total_steps=self.total_steps,
            loss=loss,
            steps_per_second=round(rate, 4) if rate else None,
            eta_seconds=round(eta, 1) if eta is not None else None,
            mean_step_seconds=round(mean, 6) if mean is not None else None,
            metrics=dict(metrics),
            state=self._progress.get("state") if self._progress.get("state") == "holding" else "running",
        )

    def _set_progress(self, **fields: Any) -> None:
        with self._lock:
            self._progress.update(fields)
            self._progress.update(
                run_key=self.store.run_key,
                stage=self.store.stage,
                updated_at=now_iso(),
                updated_at_epoch=time.time(),
            )
            self._progress_dirty = True

    def _flush(self, log: bool = True) -> None:
        """Upload new log lines (unless ``log`` is False) and changed progress (from the reporter thread, at a
        hold, and once at close).

        The log goes to a rolling chunk: the current chunk object is rewritten with its new lines until
        it passes LOG_CHUNK_BYTES, then the next one starts, so a long run makes few objects and a failed
        upload loses nothing (the lines stay in the chunk and go up with the next flush). One flush at a time:
        two at once would race on the chunk, and an older progress could land after a newer one.
        """
        with self._flush_lock:
            self._flush_unlocked(log)

    def _flush_unlocked(self, log: bool) -> None:
        with self._lock:
            lines: list[str] = []
            if log:
                lines, self._log_buffer = self._log_buffer, []
            progress = dict(self._progress) if self._progress_dirty else None
            self._progress_dirty = False
        try:
            if lines:
                self._chunk_lines += lines
                self.store.write_log_chunk(self._writer_id, self._log_seq, self._chunk_lines)
                if sum(len(line) + 1 for line in self._chunk_lines) >= LOG_CHUNK_BYTES:
                    self._log_seq += 1
                    self._chunk_lines = []
            if progress is not None and self.workers.primary:  # one progress.json per stage: worker 0's
                self.store.write_progress(progress)
        except Exception as exc:  # noqa: BLE001 - reporting must never kill training
            with self._lock:
                self._progress_dirty = self._progress_dirty or progress is not None
            try:
                sys.stderr.write(f"progress/log upload failed (will retry): {exc}\n")
            except (OSError, ValueError):
                pass

    def _report_loop(self) -> None:
        while not self._closing.wait(self.progress_seconds):
            self._flush()
