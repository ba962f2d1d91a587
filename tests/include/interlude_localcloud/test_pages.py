"""The local cloud's read-only HTML pages (the targets of Interlude's extra links on the local cloud)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage, tpu_v2

from interlude_localcloud.testing import RunningLocalCloud, running_localcloud
from tests.include.interlude_localcloud.conftest import ZONE, fast_scenario

SCRIPT = "#!/bin/bash\necho 'booted <script>alert(1)</script> & ready'\nsleep 300\n"


@pytest.fixture(scope="module")
def cloud() -> Iterator[RunningLocalCloud]:
    with running_localcloud(fast_scenario(), gcs=True, strict=True) as lc:
        yield lc


def page(lc: RunningLocalCloud, path: str) -> requests.Response:
    return requests.get(f"{lc.api_endpoint}/_localcloud/pages/{path}", timeout=30)


def test_machine_page_live_then_deleted(cloud: RunningLocalCloud) -> None:
    tpu = tpu_v2.TpuClient(
        transport="rest", client_options={"api_endpoint": cloud.api_endpoint}, credentials=AnonymousCredentials()
    )
    parent = f"projects/{cloud.project}/locations/{ZONE}"
    node = tpu_v2.Node(
        accelerator_type="v6e-8",
        runtime_version="v2-alpha-tpuv6e",
        labels={"run": "r-1"},
        metadata={"startup-script": SCRIPT},
    )
    created = tpu.create_node(parent=parent, node_id="pg1", node=node).result(timeout=30)
    deadline = time.monotonic() + 30
    while True:
        resp = page(cloud, f"machines/tpu/{ZONE}/pg1")
        if "booted" in resp.text or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/html")
    for expected in ("pg1", ZONE, "v6e-8", "READY", "run=r-1", "Upcoming maintenance"):
        assert expected in resp.text, expected
    # The serial log is the workload's text: shown escaped, never as markup.
    assert "booted &lt;script&gt;alert(1)&lt;/script&gt; &amp; ready" in resp.text
    assert "<script>" not in resp.text

    tpu.delete_node(name=created.name).result(timeout=30)
    gone = page(cloud, f"machines/tpu/{ZONE}/pg1")
    assert gone.status_code == 200 and "DELETED" in gone.text and "machine_deleted" in gone.text
    assert page(cloud, f"machines/tpu/{ZONE}/never-made").status_code == 404


def test_checkpoint_folder_page_marks_committed_steps(cloud: RunningLocalCloud) -> None:
    client = storage.Client(
        project=cloud.project, credentials=AnonymousCredentials(), client_options={"api_endpoint": cloud.gcs_endpoint}
    )
    bucket = client.create_bucket("pages-test")
    prefix = "interlude/run-1/train/"
    for name, data in {
        "checkpoints/10/state/manifest.ocdbt": b"x" * 100,
        "checkpoints/10/commit_success.txt": b"abc",
        "checkpoints/20/state/manifest.ocdbt": b"y" * 7,
        "progress.json": b"{}",
        "<b>odd</b>.txt": b"",
    }.items():
        bucket.blob(prefix + name).upload_from_string(data)
    bucket.blob("interlude/run-1/other/x").upload_from_string(b"")
    resp = page(cloud, f"gcs/pages-test/{prefix}")
    assert resp.status_code == 200
    text = resp.text
    assert "5 objects, 1 committed checkpoint steps." in text, text
    assert "<tr><td>checkpoints/10/state/manifest.ocdbt</td><td>100</td><td><span class='yes'>COMMITTED</span>" in text
    assert "<tr><td>checkpoints/20/state/manifest.ocdbt</td><td>7</td><td><span class='no'>not committed</span>" in text
    assert "&lt;b&gt;odd&lt;/b&gt;.txt" in text and "<b>odd" not in text
    assert "other/x" not in text  # only the prefix asked for
    assert page(cloud, "gcs/Not_A_Bucket!/x").status_code == 400
    assert page(cloud, "gcs/no-such-bucket/x/").status_code == 404
    whole = page(cloud, "gcs/pages-test")  # no prefix: the whole bucket
    assert whole.status_code == 200 and "interlude/run-1/other/x" in whole.text
