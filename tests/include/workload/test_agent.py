"""The machine agent never dies silently: GCS errors are said, backed off and retried; SIGTERM ends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from interlude_workload.agent import backoff


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    import random

    rng = random.Random(1)
    delays = [backoff(n, 1.0, cap=60.0, rng=rng) for n in range(1, 12)]
    assert all(0.5 <= d <= 60.0 for d in delays)
    assert delays[0] <= 1.0 and delays[-1] >= 30.0


def test_an_unreachable_gcs_is_retried_until_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    env = {**os.environ, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}  # port 9: refused at once
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "interlude_workload.agent", "--bucket", "b", "--run-key", "k", "--idle-poll", "0.2"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "agent: error #2" not in log.read_text(errors="replace"):  # said, backed off, tried again
            assert proc.poll() is None, f"the agent died:\n{log.read_text()}"
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "retrying in" in text and "heartbeat not written" in text and "agent: stopping" in text


def test_sigterm_ends_a_long_pause_without_the_handler_taking_a_lock() -> None:
    """The agent's SIGTERM handler only sets a flag (a lock taken in a handler can deadlock the main thread);
    its pauses (idle polls, back-off) poll that flag, so a stop still ends them within a fraction of a second."""
    import signal
    import threading
    import time

    from interlude_workload.agent import Agent

    agent = Agent("no-bucket", "no-run", idle_poll=30.0)
    threading.Timer(0.3, agent._on_term, args=(signal.SIGTERM, None)).start()
    started = time.monotonic()
    agent._pause(30.0)
    assert agent.stopping and time.monotonic() - started < 5.0
