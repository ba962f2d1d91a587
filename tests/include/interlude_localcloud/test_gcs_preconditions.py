"""The local GCS honours write preconditions as Google does (412 conditionNotMet), through the real client."""

from __future__ import annotations

import pytest
from google.api_core.exceptions import PreconditionFailed

from interlude_workload.gcs import storage_client


def test_if_generation_match_on_create_and_delete(bucket: str) -> None:
    blob = storage_client().bucket(bucket).blob("a/only-once.json")
    blob.upload_from_string("first", if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        blob.upload_from_string("second", if_generation_match=0)  # exists: create-only refused
    assert blob.download_as_text() == "first"
    listed = next(iter(storage_client().list_blobs(bucket, prefix="a/")))
    with pytest.raises(PreconditionFailed):
        storage_client().bucket(bucket).blob("a/only-once.json").delete(if_generation_match=int(listed.generation) + 1)
    storage_client().bucket(bucket).blob("a/only-once.json").delete(if_generation_match=int(listed.generation))
    assert not list(storage_client().list_blobs(bucket, prefix="a/"))
