"""Stage facts from one shared bucket listing: the same answers as each stage's own reads, for a
fraction of the GCS calls, counted by a proxy in front of the real GCS emulator; read over the JSON API with
httpx (no google-cloud-storage in the trigger runner)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from interlude.hooks.gcs_json import new_gcs
from interlude.stage.facts import StageFactsReader, list_bucket
from interlude.stage.observe import read_stage_facts
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.testing import GcsEmulator

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
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
        store.write(10, {"w": np.zeros(8)})  # a real Orbax step (a dozen objects; the listing asks for three)
        store.write_log_chunk("w", 0, ["not part of the facts"])
    CheckpointStore(bucket, "run00", "train").acknowledge("req1", 10)


def test_shared_listing_agrees_with_per_stage_reads_and_skips_unchanged_objects(
    bucket: str, proxy: CountingProxy
) -> None:
    _seed(bucket)
    gcs = new_gcs(proxy.endpoint)
    readers = [StageFactsReader(bucket, f"run{i:02d}", "train", gcs=gcs) for i in range(STAGES)]
    expected = [read_stage_facts(bucket, f"run{i:02d}", "train", "req1" if i == 0 else None) for i in range(STAGES)]

    def poll() -> list:
        index = list_bucket(bucket, gcs=gcs)
        return [r.read(r.objects(index), "req1" if i == 0 else None) for i, r in enumerate(readers)]

    before = proxy.snapshot()
    assert poll() == expected
    first = proxy.snapshot() - before
    # One list per glob for the whole bucket; per stage: the step's Orbax metadata (+ the one ack). The progress
    # comes with the listing (its copy in the object's metadata).
    assert first["gcs.list_objects"] == 2
    assert first["gcs.download"] == STAGES + 1

    before = proxy.snapshot()
    assert poll() == expected
    second = proxy.snapshot() - before
    assert dict(second) == {"gcs.list_objects": 2}  # nothing changed: no stage makes a call of its own

    # A new progress and a new committed step are seen at the next listing; only the step is downloaded.
    store = CheckpointStore(bucket, "run03", "train")
    store.write_progress({"step": 20, "state": "running", "boot_id": "b"})
    store.write(20, {"w": np.ones(8)})
    before = proxy.snapshot()
    facts = poll()
    third = proxy.snapshot() - before
    assert facts[3].committed_step == 20 and facts[3].progress["step"] == 20
    assert facts[:3] == expected[:3] and facts[4:] == expected[4:]
    assert dict(third) == {"gcs.list_objects": 2, "gcs.download": 1}


def test_training_stages_progress_costs_no_download_and_agrees_with_the_content(
    bucket: str, proxy: CountingProxy
) -> None:
    """A training stage rewrites progress.json about every second: each poll sees a new generation of every
    stage's progress. The listing carries it (the metadata copy the workload writes), so a poll of many
    training stages is the listing alone, and what it reads equals the object's content read on its own."""
    stores = [CheckpointStore(bucket, f"run{i:02d}", "train") for i in range(STAGES)]
    gcs = new_gcs(proxy.endpoint)
    readers = [StageFactsReader(bucket, f"run{i:02d}", "train", gcs=gcs) for i in range(STAGES)]
    for step in (1, 2, 3):
        for i, store in enumerate(stores):
            store.write_progress({"step": step * 100 + i, "state": "running", "loss": 1 / step, "boot_id": "b"})
        before = proxy.snapshot()
        index = list_bucket(bucket, gcs=gcs)
        facts = [r.read(r.objects(index), None) for r in readers]
        assert dict(proxy.snapshot() - before) == {"gcs.list_objects": 2}
        assert [f.progress for f in facts] == [store.read_progress() for store in stores]
        assert [f.progress["step"] for f in facts] == [step * 100 + i for i in range(STAGES)]


def test_progress_without_the_metadata_copy_is_downloaded(bucket: str, proxy: CountingProxy) -> None:
    """Too long for the copy (a long error), or written by a workload without it: read from the content."""
    from interlude_workload.layout import PROGRESS_METADATA_MAX

    long = CheckpointStore(bucket, "long", "train")
    long.write_progress({"step": 7, "state": "failed", "error": "x" * PROGRESS_METADATA_MAX})
    plain = CheckpointStore(bucket, "plain", "train")
    plain.bucket.blob(plain.base + "progress.json").upload_from_string(b'{"step": 9}', content_type="application/json")
    gcs = new_gcs(proxy.endpoint)
    index = list_bucket(bucket, gcs=gcs)
    assert all(o.progress is None for stage in index.values() for o in stage.values())
    before = proxy.snapshot()
    got = [
        StageFactsReader(bucket, run, "train", gcs=gcs).read(index[f"interlude/{run}/train/"], None)
        for run in ("long", "plain")
    ]
    assert dict(proxy.snapshot() - before) == {"gcs.download": 2}
    assert [f.progress for f in got] == [long.read_progress(), {"step": 9}]
    assert got[0].progress["error"] == "x" * PROGRESS_METADATA_MAX


def test_a_corrupt_newer_step_is_skipped_like_the_store_does(bucket: str) -> None:
    store = CheckpointStore(bucket, "run", "train")
    store.write(10, {"w": np.zeros(8)})
    store.write(20, {"w": np.ones(8)})
    store.bucket.blob(store.step_prefix(20) + "_CHECKPOINT_METADATA").upload_from_string(b"{torn")
    reader = StageFactsReader(bucket, "run", "train")
    objects = reader.objects(list_bucket(bucket))
    assert reader.needs_io(objects, None)
    assert reader.read(objects, None).committed_step == 10 == store.latest().checkpoint.step
    assert not reader.needs_io(objects, None)  # both verdicts are remembered for these generations
    assert reader.downloads == 2  # the step metadata of step 20 (rejected), then of step 10


def test_an_absent_or_unanswered_download_is_told_apart(bucket: str) -> None:
    """A progress.json gone since the listing is "no progress"; a GCS that does not answer leaves the last
    progress as it was (read again at the next poll), never an empty one."""
    store = CheckpointStore(bucket, "run", "train")
    store.write_progress({"step": 7, "state": "running"})
    reader = StageFactsReader(bucket, "run", "train")
    objects = reader.objects(list_bucket(bucket))
    assert reader.read(objects, None).progress["step"] == 7
    # A newer generation listed without the metadata copy (a progress too long for it): it must be downloaded.
    newer = {**objects, "progress.json": objects["progress.json"]._replace(generation=-1, progress=None)}
    reader.gcs = new_gcs("http://127.0.0.1:9")  # nothing listens on the discard port
    assert reader.read(newer, None).progress["step"] == 7
    assert reader.needs_io(newer, None)  # not taken as read: the next poll downloads it again
    reader.gcs = None
    store.bucket.blob(store.base + "progress.json").delete()
    assert reader.read(newer, None).progress == {}


def test_the_trigger_runner_reads_gcs_without_the_storage_client(bucket: str) -> None:
    """The stage trigger's whole GCS path (listing, downloads, verification) in a fresh interpreter never
    imports google-cloud-storage, google.api_core, grpc or requests (~22 MB of the trigger runner's memory)."""
    _seed(bucket)
    script = f"""
import asyncio, sys
from interlude.triggers.stage import StageTrigger
import interlude.hooks.tpu_async, interlude.hooks.compute_async  # what the trigger imports when it starts
from interlude.stage.facts import StageFactsReader, list_bucket_async

async def main():
    reader = StageFactsReader({bucket!r}, "run00", "train")
    objects = reader.objects(await list_bucket_async({bucket!r}))
    facts = await asyncio.to_thread(reader.read, objects, "req1")
    assert facts.committed_step == 10 and facts.request_ack_step == 10 and facts.progress["step"] == 10, facts

asyncio.run(main())
heavy = ("grpc", "requests", "google.cloud.storage", "google.api_core")
print("HEAVY", sorted(m for m in sys.modules if m.startswith(heavy) and m.split(".")[0] != "requests_toolbelt"))
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ), timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "HEAVY []" in out.stdout, out.stdout


def test_the_triggers_listing_runs_in_one_thread_of_its_own_and_agrees(bucket: str) -> None:
    """The async listing the triggers share gives list_bucket's index, every time from the same worker
    thread (not the default executor's: each thread that lists keeps a malloc arena at the listing's peak)."""
    import asyncio
    import threading

    from interlude.stage import facts as stage_facts

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


def test_both_readers_give_when_the_workload_answered_a_request(bucket: str) -> None:
    """Issue 32.5: the event's checkpoint time is the workload's answer (its ack's committed_at), not a poll's."""
    import json
    from datetime import datetime

    _seed(bucket)
    store = CheckpointStore(bucket, "run00", "train")
    written = json.loads(store.bucket.blob(store.base + "control/ack-req1.json").download_as_bytes())
    at = datetime.fromisoformat(written["committed_at"].replace("Z", "+00:00")).timestamp()
    reader = StageFactsReader(bucket, "run00", "train")
    listed = reader.read(reader.objects(list_bucket(bucket)), "req1")
    direct = read_stage_facts(bucket, "run00", "train", "req1")
    assert (listed.request_ack_step, listed.request_ack_at) == (direct.request_ack_step, direct.request_ack_at)
    assert listed.request_ack_at == at and listed.request_ack_step == 10
    assert read_stage_facts(bucket, "run00", "train", "none-such").request_ack_at is None
