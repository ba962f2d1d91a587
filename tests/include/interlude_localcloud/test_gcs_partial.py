"""The local GCS answers partial responses (``fields``) as Google's front end does: only the selected fields of
each listed object, a malformed selection refused with a 400; downloads and errors untouched. Over plain HTTP
against the real emulator process, as the triggers' JSON-API reader (interlude.hooks.gcs_json) talks to it."""

from __future__ import annotations

import httpx
import numpy as np

from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.testing import GcsEmulator


def test_a_listing_sends_only_the_selected_fields(gcs_emulator: GcsEmulator, bucket: str) -> None:
    store = CheckpointStore(bucket, "run", "train")
    store.write_progress({"step": 3, "state": "running"})
    store.write(3, {"w": np.frombuffer(b"\0" * 8, np.uint8)})
    url = f"{gcs_emulator.endpoint}/storage/v1/b/{bucket}/o"
    full = httpx.get(url, params={"prefix": "interlude/"}).json()
    assert {"selfLink", "mediaLink", "md5Hash", "generation"} <= set(full["items"][0])
    part = httpx.get(url, params={"prefix": "interlude/", "fields": "items(name,generation,metadata),nextPageToken"})
    assert part.status_code == 200
    items = part.json()["items"]
    assert set(part.json()) == {"items"}  # one page: no nextPageToken to keep
    assert [i["name"] for i in items] == [i["name"] for i in full["items"]]
    assert all(set(i) <= {"name", "generation", "metadata"} and "generation" in i for i in items)
    progress = next(i for i in items if i["name"].endswith("progress.json"))
    assert progress["metadata"]["interlude-progress"] == '{"state": "running", "step": 3}'
    # An object's own resource, and a download: the selection applies to the JSON resource only.
    one = httpx.get(f"{url}/{progress['name'].replace('/', '%2F')}", params={"fields": "name,size"}).json()
    assert set(one) == {"name", "size"}
    media = httpx.get(
        f"{gcs_emulator.endpoint}/download/storage/v1/b/{bucket}/o/{progress['name'].replace('/', '%2F')}",
        params={"alt": "media", "fields": "name"},
    )
    assert media.json() == {"state": "running", "step": 3}


def test_a_malformed_selection_is_a_400_and_an_error_is_never_narrowed(gcs_emulator: GcsEmulator, bucket: str) -> None:
    url = f"{gcs_emulator.endpoint}/storage/v1/b/{bucket}/o"
    bad = httpx.get(url, params={"fields": "items(name"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400
    missing = httpx.get(f"{gcs_emulator.endpoint}/storage/v1/b/{bucket}/o/nothing-here", params={"fields": "name"})
    assert missing.status_code == 404
