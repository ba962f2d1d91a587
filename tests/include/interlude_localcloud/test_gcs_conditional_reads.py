"""The local GCS reads and lists objects as Google's JSON API does (interlude_localcloud.gcs_reads), over plain HTTP
against the real emulator process, and through tensorstore's own ``gcs`` kvstore (Orbax's array store):

- downloads carry ``x-goog-generation``/``x-goog-metageneration``/``x-goog-stored-content-length``
  (https://cloud.google.com/storage/docs/xml-api/reference-headers);
- reads honour ``generation`` and ``ifGenerationMatch``/``ifMetagenerationMatch`` (412) and
  ``ifGenerationNotMatch``/``ifMetagenerationNotMatch`` (304, no body)
  (https://cloud.google.com/storage/docs/json_api/v1/objects/get);
- ``Range`` in the three forms tensorstore sends, 416 past the end;
- listings honour ``startOffset``/``endOffset``/``maxResults``/``pageToken``/``includeTrailingDelimiter``
  (https://cloud.google.com/storage/docs/json_api/v1/objects/list).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from interlude_workload.testing import GcsEmulator

BODY = b"0123456789abcdef"


def _put(emulator: GcsEmulator, bucket: str, name: str, data: bytes = BODY) -> dict[str, Any]:
    url = f"{emulator.endpoint}/upload/storage/v1/b/{bucket}/o"
    answer = httpx.post(url, params={"uploadType": "media", "name": name}, content=data)
    assert answer.status_code == 200
    return dict(answer.json())


def _object_url(emulator: GcsEmulator, bucket: str, name: str, download: bool = False) -> str:
    root = f"{emulator.endpoint}/download" if download else emulator.endpoint
    return f"{root}/storage/v1/b/{bucket}/o/{quote(name, safe='')}"


@pytest.mark.parametrize("download", [False, True], ids=["json-api", "download-route"])
def test_a_download_carries_the_generation_headers(gcs_emulator: GcsEmulator, bucket: str, download: bool) -> None:
    made = _put(gcs_emulator, bucket, "m/obj.bin")
    url = _object_url(gcs_emulator, bucket, "m/obj.bin", download)
    got = httpx.get(url, params={"alt": "media"})
    assert got.status_code == 200 and got.content == BODY
    assert got.headers["x-goog-generation"] == made["generation"]
    assert got.headers["x-goog-metageneration"] == "1"
    assert got.headers["x-goog-stored-content-length"] == str(len(BODY))
    assert got.headers["x-goog-hash"] == f"crc32c={made['crc32c']},md5={made['md5Hash']}"
    # A metadata update is a new metageneration of the same generation.
    patched = httpx.patch(_object_url(gcs_emulator, bucket, "m/obj.bin"), json={"metadata": {"k": "v"}})
    assert patched.status_code == 200
    again = httpx.get(url, params={"alt": "media"})
    assert again.headers["x-goog-generation"] == made["generation"]
    assert again.headers["x-goog-metageneration"] == "2"
    assert again.headers["x-goog-meta-k"] == "v"


@pytest.mark.parametrize("alt", ["media", "json"])
def test_reads_honour_generation_preconditions(gcs_emulator: GcsEmulator, bucket: str, alt: str) -> None:
    gen = int(_put(gcs_emulator, bucket, "c/obj")["generation"])
    url = _object_url(gcs_emulator, bucket, "c/obj")

    def read(**conditions: Any) -> httpx.Response:
        return httpx.get(url, params={"alt": alt, **conditions})

    assert read(ifGenerationMatch=gen).status_code == 200
    refused = read(ifGenerationMatch=gen + 1)
    assert refused.status_code == 412
    assert refused.json()["error"]["errors"][0]["reason"] == "conditionNotMet"
    unchanged = read(ifGenerationNotMatch=gen)
    assert unchanged.status_code == 304 and unchanged.content == b""
    changed = read(ifGenerationNotMatch=gen - 1)
    assert changed.status_code == 200
    assert (changed.content == BODY) if alt == "media" else (changed.json()["generation"] == str(gen))
    assert read(ifGenerationMatch=gen + 1, ifGenerationNotMatch=gen).status_code == 412  # an error before a 304
    assert read(ifGenerationMatch="x").status_code == 400
    assert read(generation=gen).status_code == 200
    assert read(generation=gen - 1).status_code == 404  # no other generation is kept (as for a deleted one)
    missing = httpx.get(_object_url(gcs_emulator, bucket, "c/none"), params={"alt": alt, "ifGenerationNotMatch": 1})
    assert missing.status_code == 404


def test_reads_honour_metageneration_preconditions(gcs_emulator: GcsEmulator, bucket: str) -> None:
    _put(gcs_emulator, bucket, "g/obj")
    url = _object_url(gcs_emulator, bucket, "g/obj")
    assert httpx.patch(url, json={"metadata": {"a": "1"}}).json()["metageneration"] == "2"
    for alt in ("media", "json"):
        assert httpx.get(url, params={"alt": alt, "ifMetagenerationMatch": 2}).status_code == 200
        assert httpx.get(url, params={"alt": alt, "ifMetagenerationMatch": 1}).status_code == 412
        assert httpx.get(url, params={"alt": alt, "ifMetagenerationNotMatch": 2}).status_code == 304
        assert httpx.get(url, params={"alt": alt, "ifMetagenerationNotMatch": 1}).status_code == 200


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [("bytes=2-4", 2, 4), ("bytes=10-", 10, 15), ("bytes=-3", 13, 15), ("bytes=-100", 0, 15), ("bytes=12-99", 12, 15)],
)
def test_ranges(gcs_emulator: GcsEmulator, bucket: str, header: str, first: int, last: int) -> None:
    made = _put(gcs_emulator, bucket, "r/obj")
    got = httpx.get(_object_url(gcs_emulator, bucket, "r/obj"), params={"alt": "media"}, headers={"Range": header})
    assert got.status_code == 206
    assert got.content == BODY[first : last + 1]
    assert got.headers["content-range"] == f"bytes {first}-{last}/{len(BODY)}"
    assert got.headers["x-goog-generation"] == made["generation"]


def test_a_range_past_the_end_is_416(gcs_emulator: GcsEmulator, bucket: str) -> None:
    _put(gcs_emulator, bucket, "r/short")
    url = _object_url(gcs_emulator, bucket, "r/short")
    assert httpx.get(url, params={"alt": "media"}, headers={"Range": f"bytes={len(BODY)}-"}).status_code == 416
    whole = httpx.get(url, params={"alt": "media"}, headers={"Range": "items=0-1"})  # not bytes: ignored
    assert whole.status_code == 200 and whole.content == BODY


def _list(emulator: GcsEmulator, bucket: str, **query: Any) -> httpx.Response:
    return httpx.get(f"{emulator.endpoint}/storage/v1/b/{bucket}/o", params=query)


def test_listing_offsets_select_a_key_range(gcs_emulator: GcsEmulator, bucket: str) -> None:
    for name in ("k/a", "k/b", "k/c", "k/c/d", "k/d", "l/a"):
        _put(gcs_emulator, bucket, name)
    page = _list(gcs_emulator, bucket, startOffset="k/b", endOffset="k/d").json()
    assert [i["name"] for i in page["items"]] == ["k/b", "k/c", "k/c/d"]  # start inclusive, end exclusive
    page = _list(gcs_emulator, bucket, startOffset="k/c0").json()
    assert [i["name"] for i in page["items"]] == ["k/d", "l/a"]
    page = _list(gcs_emulator, bucket, prefix="k/", delimiter="/", startOffset="k/c/").json()
    assert page["prefixes"] == ["k/c/"] and [i["name"] for i in page["items"]] == ["k/d"]
    nothing = _list(gcs_emulator, bucket, startOffset="m").json()
    assert nothing == {"kind": "storage#objects"}  # empty items/prefixes are left out, as Google does


def test_listing_pages_count_items_and_prefixes_together(gcs_emulator: GcsEmulator, bucket: str) -> None:
    names = ["p/a", "p/b/1", "p/b/2", "p/c", "p/d/1", "p/e"]
    for name in names:
        _put(gcs_emulator, bucket, name)
    seen, pages, query = [], 0, {"prefix": "p/", "delimiter": "/", "maxResults": 2}
    while True:
        page = _list(gcs_emulator, bucket, **query).json()
        pages += 1
        entries = [i["name"] for i in page.get("items", [])] + page.get("prefixes", [])
        assert len(entries) <= 2
        seen += entries
        if "nextPageToken" not in page:
            break
        query["pageToken"] = page["nextPageToken"]
    assert sorted(seen) == ["p/a", "p/b/", "p/c", "p/d/", "p/e"] and pages == 3
    assert _list(gcs_emulator, bucket, pageToken="not-a-token").status_code == 400
    assert _list(gcs_emulator, bucket, maxResults=0).status_code == 400


def test_listing_include_trailing_delimiter(gcs_emulator: GcsEmulator, bucket: str) -> None:
    for name in ("t/dir/", "t/dir/x", "t/y"):
        _put(gcs_emulator, bucket, name)
    plain = _list(gcs_emulator, bucket, prefix="t/", delimiter="/").json()
    assert plain["prefixes"] == ["t/dir/"] and [i["name"] for i in plain["items"]] == ["t/y"]
    both = _list(gcs_emulator, bucket, prefix="t/", delimiter="/", includeTrailingDelimiter="true").json()
    assert both["prefixes"] == ["t/dir/"] and [i["name"] for i in both["items"]] == ["t/dir/", "t/y"]


def test_tensorstore_compare_and_swap(gcs_emulator: GcsEmulator, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorstore's gcs kvstore (what OCDBT's manifest updates go through): a read's generation is the one a
    conditional write must name; a stale one loses; a re-read naming the current generation is 'unchanged'."""
    from interlude_workload.orbax_env import environment_for

    for key, value in environment_for(gcs_emulator.endpoint).items():
        monkeypatch.setenv(key, value)
    import tensorstore as ts

    store = ts.KvStore.open({"driver": "gcs", "bucket": bucket, "path": "ts/"}).result()
    absent = store.read("manifest").result()
    assert absent.state == "missing"
    first = store.write("manifest", b"v1", if_equal=absent.stamp.generation).result()  # create only if absent
    assert store.write("manifest", b"v0", if_equal=absent.stamp.generation).result().generation == b""  # lost
    read = store.read("manifest").result()
    assert read.state == "value" and read.value == b"v1" and read.stamp.generation == first.generation
    second = store.write("manifest", b"v2", if_equal=read.stamp.generation).result()
    assert second.generation not in (b"", first.generation)
    stale = store.write("manifest", b"v3", if_equal=first.generation).result()
    assert stale.generation == b""  # refused: the object moved on
    again = store.read("manifest", if_not_equal=second.generation).result()
    assert again.state == "unspecified" and again.stamp.generation == second.generation  # a 304
    tail = store.read("manifest", byte_range=slice(1, None), if_not_equal=first.generation).result()
    assert tail.value == b"2" and tail.stamp.generation == second.generation  # a range's generation: the header


_LIST_AND_DELETE = """
import json, sys
import tensorstore as ts
store = ts.KvStore.open({"driver": "gcs", "bucket": sys.argv[1], "path": "ts/"}).result()
print(json.dumps(sorted(key.decode() for key in store.list().result())))
store.delete_range(ts.KvStore.KeyRange()).result()
"""


def test_tensorstore_lists_and_deletes_only_its_key_range(gcs_emulator: GcsEmulator, bucket: str) -> None:
    """tensorstore selects a directory by startOffset/endOffset alone: a store under ``ts/`` lists and deletes
    (DeleteRange, as Orbax's cleanup of a directory) that directory, never its neighbours. In a process of its
    own: given names outside its range, tensorstore aborts the process."""
    from interlude_workload.orbax_env import environment_for

    for name in ("ts/a", "ts/b/c", "tr", "ts", "tt/a", "u"):
        _put(gcs_emulator, bucket, name)
    env = {**os.environ, **environment_for(gcs_emulator.endpoint)}
    proc = subprocess.run(
        [sys.executable, "-c", _LIST_AND_DELETE, bucket], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == ["a", "b/c"]
    left = [i["name"] for i in _list(gcs_emulator, bucket).json()["items"]]
    assert left == ["tr", "ts", "tt/a", "u"]


def test_an_upload_that_expects_100_continue_gets_it_before_sending_its_body(
    gcs_emulator: GcsEmulator, bucket: str
) -> None:
    """libcurl (tensorstore's client) sends ``Expect: 100-continue`` with a body over 1 MB and waits for the interim
    answer, or a second, before sending it; Google answers at once (RFC 9110 10.1.1). Here the body is only sent
    after the 100 arrived, so a server that does not send it fails the read below instead of being waited out."""
    import socket
    from urllib.parse import urlsplit

    endpoint = urlsplit(gcs_emulator.endpoint)
    body = os.urandom(2 * 1024 * 1024)
    head = (
        f"POST /upload/storage/v1/b/{bucket}/o?uploadType=media&name=expect-continue HTTP/1.1\r\n"
        f"Host: {endpoint.netloc}\r\nContent-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n"
        "Expect: 100-continue\r\n\r\n"
    )
    with socket.create_connection((endpoint.hostname, endpoint.port), timeout=30) as conn:
        conn.sendall(head.encode())
        interim = conn.recv(64)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n"), interim
        conn.sendall(body)
        final = b""
        while b"\r\n" not in final:
            final += conn.recv(4096)
        assert final.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")), final[:200]
    stored = httpx.get(_object_url(gcs_emulator, bucket, "expect-continue", download=True), params={"alt": "media"})
    assert stored.content == body
