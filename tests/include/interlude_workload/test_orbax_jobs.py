"""A job that checkpoints with plain Orbax (no Interlude code in it) into its stage's prefix is watched as Interlude's
own: the store and the triggerer's shared listing see its finalised steps, never a step Orbax did not finish.

The job is a real process running only numpy and orbax.checkpoint, as a MaxText-style trainer does
(``ocp.CheckpointManager(gs://.../STAGE/checkpoints, item_names=("items",))``); it reaches the GCS emulator the way
such a job would on a workstation (the environment orbax_env describes). A save cut short is a real ``kill -9``
while the job waits on its last write: a proxy in front of the emulator holds the upload of the step's
``commit_success.txt`` until the process is gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from urllib.parse import unquote

import numpy as np
import pytest

from interlude.stage.facts import StageFactsReader, list_bucket
from interlude_workload.checkpoints import COMMIT_SUCCESS, STEP_METADATA, CheckpointStore
from interlude_workload.orbax_env import environment_for
from interlude_workload.testing import GcsEmulator

RUN, STAGE = "maxtext-like", "train"

PLAIN_ORBAX_JOB = """
import sys
import numpy as np
import orbax.checkpoint as ocp

root, steps = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
manager = ocp.CheckpointManager(
    root, item_names=("items",), options=ocp.CheckpointManagerOptions(max_to_keep=5, enable_async_checkpointing=True)
)
print("resuming after", manager.latest_step(), flush=True)
for step in steps:
    state = {"params": {"w": np.full((64, 256), step, np.float32)}, "step": np.int64(step)}
    manager.save(step, args=ocp.args.Composite(items=ocp.args.PyTreeSave(state)))
    manager.wait_until_finished()
    print("saved", step, flush=True)
manager.close()
"""


def _job(endpoint: str, bucket: str, steps: str) -> subprocess.Popen[str]:
    env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint, **environment_for(endpoint)}
    root = f"gs://{bucket}/interlude/{RUN}/{STAGE}/checkpoints"
    return subprocess.Popen(
        [sys.executable, "-c", PLAIN_ORBAX_JOB, root, steps],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    return out


def _facts_step(bucket: str) -> int:
    """What the stage trigger sees: the shared bucket listing (narrowed to markers) and its reader."""
    reader = StageFactsReader(bucket, RUN, STAGE)
    return reader.read(reader.objects(list_bucket(bucket)), None).committed_step


def test_a_plain_orbax_job_is_seen_committed_and_restorable(gcs_emulator: GcsEmulator, bucket: str) -> None:
    out = _finish(_job(gcs_emulator.endpoint, bucket, "10,20,30"))
    assert "resuming after None" in out and "saved 30" in out
    store = CheckpointStore(bucket, RUN, STAGE)
    latest = store.latest()
    assert latest.checkpoint is not None and latest.checkpoint.step == 30 and latest.rejected == []
    assert latest.checkpoint.uri == f"gs://{bucket}/interlude/{RUN}/{STAGE}/checkpoints/30/"
    assert latest.checkpoint.metrics == {} and latest.checkpoint.committed_at is not None
    assert _facts_step(bucket) == 30
    checkpoint, items, rejected = store.restore()  # its own item name, read back as Orbax saved it
    assert checkpoint.step == 30 and rejected == []
    assert float(np.asarray(items["items"]["params"]["w"])[0, 0]) == 30.0 and int(items["items"]["step"]) == 30
    assert store.retain(keep=2) == [10]  # Interlude's retention over the job's steps, the latest kept


class HoldingProxy:
    """A proxy in front of the emulator that holds one kind of request (never answers it) until released."""

    def __init__(self, upstream: str, hold: str) -> None:
        from benchmarks.counting_proxy import CountingProxy, classify_gcs

        outer = self
        self.hold = hold
        self.held = threading.Event()
        self.released = False

        class Holding(CountingProxy):
            async def _handle(self, request):  # type: ignore[no-untyped-def]
                if request.method == "POST" and outer.hold in unquote(request.path_qs):
                    outer.held.set()
                    while not outer.released:
                        await asyncio.sleep(0.05)
                    from aiohttp import web

                    return web.json_response({"error": {"code": 503, "message": "released"}}, status=503)
                return await super()._handle(request)

        self.proxy = Holding(upstream, classify_gcs).start()

    def stop(self) -> None:
        self.released = True
        self.proxy.stop()


@pytest.fixture
def holding(gcs_emulator: GcsEmulator, bucket: str) -> Iterator[HoldingProxy]:
    proxy = HoldingProxy(gcs_emulator.endpoint, f"/{RUN}/{STAGE}/checkpoints/2/{COMMIT_SUCCESS}")
    yield proxy
    proxy.stop()


def test_a_save_killed_before_orbax_finalised_it_is_never_the_latest(
    gcs_emulator: GcsEmulator, bucket: str, holding: HoldingProxy
) -> None:
    job = _job(holding.proxy.endpoint, bucket, "1,2")
    try:
        deadline = time.monotonic() + 180
        while not holding.held.wait(0.2):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        os.kill(job.pid, signal.SIGKILL)  # waiting on its last write: everything else of step 2 is in GCS
        job.wait(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    store = CheckpointStore(bucket, RUN, STAGE)
    listed = {s.step: s for s in store.scan()}
    assert sorted(listed) == [1, 2] and listed[1].committed and not listed[2].committed
    assert STEP_METADATA in listed[2].objects and f"items/{COMMIT_SUCCESS}" in listed[2].objects  # all but the last
    latest = store.latest()
    assert latest.checkpoint is not None and latest.checkpoint.step == 1
    assert [(r.step, r.corrupt) for r in latest.rejected] == [(2, False)]  # cut short is not corrupt
    assert _facts_step(bucket) == 1
    # The job resumes by its own Orbax code, which agrees (step 2 unfinished), and saves step 2 again.
    holding.released = True
    out = _finish(_job(gcs_emulator.endpoint, bucket, "2"))
    assert "resuming after 1" in out and "saved 2" in out
    assert store.latest().checkpoint.step == 2 and _facts_step(bucket) == 2
