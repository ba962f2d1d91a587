"""Stage facts from one shared bucket listing: the same answers as each stage's own reads, for a
fraction of the GCS calls, counted by a proxy in front of the real GCS emulator."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlude.observe import read_stage_facts
from interlude.stage_facts import StageFactsReader, list_bucket
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.gcs import storage_client
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
    client = storage_client(emulator=proxy.endpoint)
    readers = [StageFactsReader(bucket, f"run{i:02d}", "train", client=client) for i in range(STAGES)]
    expected = [read_stage_facts(bucket, f"run{i:02d}", "train", "req1" if i == 0 else None) for i in range(STAGES)]

    def poll() -> list:
        index = list_bucket(bucket, client=client)
        return [r.read(r.objects(index), "req1" if i == 0 else None) for i, r in enumerate(readers)]

    before = proxy.snapshot()
    assert poll() == expected
    first = proxy.snapshot() - before
    # One list per glob for the whole bucket; per stage: progress + manifest + COMMITTED (+ the one ack).
    assert first["gcs.list_objects"] == 2
    assert first["gcs.download"] == STAGES * 3 + 1

    before = proxy.snapshot()
    assert poll() == expected
    second = proxy.snapshot() - before
    assert dict(second) == {"gcs.list_objects": 2}  # nothing changed: no stage makes a call of its own

    # A new progress and a new committed step are seen at the next listing, and only they are downloaded.
    store = CheckpointStore(bucket, "run03", "train")
    store.write_progress({"step": 20, "state": "running", "boot_id": "b"})
    store.write(20, {"model.bin": b"\1" * 64})
    before = proxy.snapshot()
    facts = poll()
    third = proxy.snapshot() - before
    assert facts[3].committed_step == 20 and facts[3].progress["step"] == 20
    assert facts[:3] == expected[:3] and facts[4:] == expected[4:]
    assert dict(third) == {"gcs.list_objects": 2, "gcs.download": 3}


def test_a_corrupt_newer_step_is_skipped_like_the_store_does(bucket: str) -> None:
    store = CheckpointStore(bucket, "run", "train")
    store.write(10, {"model.bin": b"a" * 8})
    store.write(20, {"model.bin": b"b" * 8})
    store.bucket.blob(store.step_prefix(20) + "COMMITTED").upload_from_string(b"0" * 64)  # wrong sha256
    reader = StageFactsReader(bucket, "run", "train")
    objects = reader.objects(list_bucket(bucket))
    assert reader.needs_io(objects, None)
    assert reader.read(objects, None).committed_step == 10 == store.latest().checkpoint.step
    assert not reader.needs_io(objects, None)  # both verdicts are remembered for these generations


def test_the_triggers_listing_runs_in_one_thread_of_its_own_and_agrees(bucket: str) -> None:
    """The async listing the triggers share gives list_bucket's index, every time from the same worker
    thread (not the default executor's: each thread that lists keeps a malloc arena at the listing's peak)."""
    import asyncio
    import threading

    from interlude import stage_facts

    _seed(bucket)
    threads: list[str] = []
    plain = stage_facts.list_bucket

    def recording(name: str) -> dict:
        threads.append(threading.current_thread().name)
        return plain(name)

    async def twice() -> list[dict]:
        return [await stage_facts.list_bucket_async(bucket) for _ in range(2)]

    stage_facts.list_bucket = recording  # type: ignore[assignment]
    try:
        indexes = asyncio.run(twice())
    finally:
        stage_facts.list_bucket = plain  # type: ignore[assignment]
    assert indexes == [plain(bucket)] * 2 and len(indexes[0]) == STAGES
    assert len(set(threads)) == 1 and threads[0].startswith("interlude-bucket-list")
