"""Stage facts from one shared bucket listing: the same answers as each stage's own reads, for a
fraction of the GCS calls, counted by a proxy in front of the real GCS emulator; read over the JSON API with
the triggerer's own async client (no google-cloud-storage in the trigger runner)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlude.hooks.gcs_async import new_gcs
from interlude.observe import read_stage_facts
from interlude.stage_facts import StageFactsReader, list_bucket
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.testing import GcsEmulator

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
from counting_proxy import CountingProxy, classify_gcs

STAGES = 12


@pytest.fixture
def proxy(gcs_emulator: GcsEmulator) -> Iterator[CountingProxy]:
    counting = CountingProxy(gcs_emulator.endpoint, classify_gcs).start()
    yield counting
    counting.stop()


def _seed(bucket: str) -> None:
    for i in range(STAGES):
        store = CheckpointStore(bucket, f"run{i:02d}", "train")
        store.write_progress({"step": 10 + i, "state": "running", "boot_id": "b"})
        store.write(10, {"model.bin": b"\0" * 64})
        store.write_log_chunk("w", 0, ["not part of the facts"])
    CheckpointStore(bucket, "run00", "train").acknowledge("req1", 10)


def test_shared_listing_agrees_with_per_stage_reads_and_skips_unchanged_objects(
    bucket: str, proxy: CountingProxy
) -> None:
    _seed(bucket)
    expected = [read_stage_facts(bucket, f"run{i:02d}", "train", "req1" if i == 0 else None) for i in range(STAGES)]

    async def polls() -> None:
        gcs = await new_gcs(proxy.endpoint)
        readers = [StageFactsReader(bucket, f"run{i:02d}", "train", gcs=gcs) for i in range(STAGES)]

        async def poll() -> list:
            index = await list_bucket(bucket, gcs=gcs)
            return [await r.read(r.objects(index), "req1" if i == 0 else None) for i, r in enumerate(readers)]

        before = proxy.snapshot()
        assert await poll() == expected
        first = proxy.snapshot() - before
        # One list per glob for the whole bucket; per stage: progress + manifest + COMMITTED (+ the one ack).
        assert first["gcs.list_objects"] == 2
        assert first["gcs.download"] == STAGES * 3 + 1

        before = proxy.snapshot()
        assert await poll() == expected
        second = proxy.snapshot() - before
        assert dict(second) == {"gcs.list_objects": 2}  # nothing changed: no stage makes a call of its own

        # A new progress and a new committed step are seen at the next listing, and only they are downloaded.
        store = CheckpointStore(bucket, "run03", "train")
        await asyncio.to_thread(store.write_progress, {"step": 20, "state": "running", "boot_id": "b"})
        await asyncio.to_thread(store.write, 20, {"model.bin": b"\1" * 64})
        before = proxy.snapshot()
        facts = await poll()
        third = proxy.snapshot() - before
        assert facts[3].committed_step == 20 and facts[3].progress["step"] == 20
        assert facts[:3] == expected[:3] and facts[4:] == expected[4:]
        assert dict(third) == {"gcs.list_objects": 2, "gcs.download": 3}
        await gcs.aclose()

    asyncio.run(polls())


def test_a_corrupt_newer_step_is_skipped_like_the_store_does(bucket: str) -> None:
    store = CheckpointStore(bucket, "run", "train")
    store.write(10, {"model.bin": b"a" * 8})
    store.write(20, {"model.bin": b"b" * 8})
    store.bucket.blob(store.step_prefix(20) + "COMMITTED").upload_from_string(b"0" * 64)  # wrong sha256

    async def read() -> None:
        reader = StageFactsReader(bucket, "run", "train")
        objects = reader.objects(await list_bucket(bucket))
        assert reader.needs_io(objects, None)
        assert (await reader.read(objects, None)).committed_step == 10 == store.latest().checkpoint.step
        assert not reader.needs_io(objects, None)  # both verdicts are remembered for these generations
        assert reader.downloads == 4  # manifest + COMMITTED of step 20 (rejected) and of step 10

    asyncio.run(read())


def test_an_absent_or_unanswered_download_is_told_apart(bucket: str) -> None:
    """A progress.json gone since the listing is "no progress"; a GCS that does not answer leaves the last
    progress as it was (read again at the next poll), never an empty one."""
    store = CheckpointStore(bucket, "run", "train")
    store.write_progress({"step": 7, "state": "running"})

    async def reads() -> None:
        reader = StageFactsReader(bucket, "run", "train")
        objects = reader.objects(await list_bucket(bucket))
        assert (await reader.read(objects, None)).progress["step"] == 7
        newer = {**objects, "progress.json": objects["progress.json"]._replace(generation=-1)}
        reader.gcs = await new_gcs("http://127.0.0.1:9")  # nothing listens on the discard port
        assert (await reader.read(newer, None)).progress["step"] == 7
        assert reader.needs_io(newer, None)  # not taken as read: the next poll downloads it again
        reader.gcs = None
        await asyncio.to_thread(store.bucket.blob(store.base + "progress.json").delete)
        assert (await reader.read(newer, None)).progress == {}

    asyncio.run(reads())


def test_the_trigger_runner_reads_gcs_without_the_storage_client(bucket: str) -> None:
    """The stage trigger's whole GCS path (listing, downloads, verification) in a fresh interpreter never
    imports google-cloud-storage, google.api_core, grpc or requests (~25 MB of the trigger runner's memory)."""
    _seed(bucket)
    script = f"""
import asyncio, sys
from interlude.triggers.stage import StageTrigger
import interlude.hooks.tpu_async, interlude.hooks.compute_async  # what the trigger imports when it starts
from interlude.stage_facts import StageFactsReader, list_bucket

async def main():
    reader = StageFactsReader({bucket!r}, "run00", "train")
    facts = await reader.read(reader.objects(await list_bucket({bucket!r})), "req1")
    assert facts.committed_step == 10 and facts.request_ack_step == 10 and facts.progress["step"] == 10, facts

asyncio.run(main())
heavy = ("grpc", "requests", "google.cloud.storage", "google.api_core")
heavy = sorted(m for m in sys.modules if m.startswith(heavy) and m.split(".")[0] != "requests_toolbelt")
print("HEAVY", heavy)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY []" in out.stdout, out.stdout
