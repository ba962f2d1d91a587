"""The fine-tune's Hugging Face export in GCS: whole or absent, written once, never over other weights."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlude_workload import hf_export, layout
from interlude_workload.gcs import storage_client

RUN = "export-run"


@pytest.fixture(scope="module")
def params() -> object:
    from interlude_workload.llm import train_step

    return train_step.init_state(seed=3)["params"]


def _generations(client, bucket: str) -> dict[str, int]:
    prefix = layout.export_prefix(RUN, "finetune")
    return {b.name: b.generation for b in client.list_blobs(bucket, prefix=prefix)}


def test_published_once_whole_and_loadable_and_never_over_other_weights(bucket: str, params, tmp_path: Path) -> None:
    from interlude_workload.llm import numpy_forward
    from interlude_workload.llm.train_step import params_digest

    client = storage_client()
    assert hf_export.read_marker(client, bucket, RUN, "finetune") is None
    digest = params_digest(params)
    first = hf_export.publish(client, bucket, RUN, "finetune", step=40, digest=digest, params=params)
    assert first.written and first.uri == f"gs://{bucket}/interlude/{RUN}/finetune/export"
    marker = hf_export.read_marker(client, bucket, RUN, "finetune")
    assert marker is not None and marker["step"] == 40 and marker["params_sha256"] == digest
    names = set(_generations(client, bucket))
    prefix = layout.export_prefix(RUN, "finetune")
    assert {prefix + n for n in ("config.json", "model.safetensors", "tokenizer.json", hf_export.MARKER)} <= names

    # What a loader downloads is the model: every blob's CRC32C is the marker's, and the weights load and run.
    for blob in client.list_blobs(bucket, prefix=prefix):
        name = blob.name[len(prefix) :]
        if name != hf_export.MARKER:
            assert blob.crc32c == marker["files"][name]["crc32c"], name
            blob.download_to_filename(str(tmp_path / name))
    weights, config = numpy_forward.load_export(tmp_path)
    assert numpy_forward.greedy_generate(weights, config, [0, 5, 6], 4)

    before = _generations(client, bucket)
    again = hf_export.publish(client, bucket, RUN, "finetune", step=40, digest=digest, params=params)
    assert not again.written and _generations(client, bucket) == before  # a retry rewrites nothing
    with pytest.raises(hf_export.ExportConflict):
        hf_export.publish(client, bucket, RUN, "finetune", step=41, digest="0" * 64, params=params)
    assert _generations(client, bucket) == before

    # A file gone (or cut short) and the export is not whole: no reader takes it.
    client.bucket(bucket).blob(prefix + "model.safetensors").upload_from_string(b"short")
    assert hf_export.read_marker(client, bucket, RUN, "finetune") is None
