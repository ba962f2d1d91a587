"""Guest attributes as Google keeps them: the guest PUTs `instance/guest-attributes/NAMESPACE/KEY` to its
metadata server; the TPU API's nodes.getGuestAttributes (the real google-cloud-tpu client) reads them back.
This is how Interlude sees that a TPU VM's startup script ended, TPU nodes having no serial console API."""

from __future__ import annotations

import time

import requests
from google.cloud import tpu_v2

from interlude_localcloud.testing import RunningLocalCloud

from .conftest import ZONE

SCRIPT = """#!/bin/bash
curl -sf -X PUT --data-binary 'ended: exit 3' -H 'Metadata-Flavor: Google' \\
  "$INTERLUDE_METADATA_URL/instance/guest-attributes/interlude/startup"
curl -sf -X PUT --data-binary 'x' "$INTERLUDE_METADATA_URL/instance/guest-attributes/interlude/no-header" \\
  || echo refused-without-header > refused
exit 3
"""


def test_what_the_guest_writes_the_tpu_api_reads_back(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    parent = f"projects/{lc.project}/locations/{ZONE}"
    node = tpu_v2.Node(
        accelerator_type="v6e-8",
        runtime_version="v2-alpha-tpuv6e",
        metadata={"startup-script": SCRIPT, "enable-guest-attributes": "TRUE"},
    )
    created = tpu.create_node(parent=parent, node_id="guest", node=node).result(timeout=10)

    def read(path: str) -> list[tuple[str, str, str]]:
        out = tpu.get_guest_attributes(request={"name": created.name, "query_path": path})
        return [(e.namespace, e.key, e.value) for a in out.guest_attributes for e in a.query_value.items]

    deadline = time.time() + 20
    while not read("interlude/"):
        assert time.time() < deadline, "the guest's attribute never showed"
        time.sleep(0.1)
    assert read("interlude/") == [("interlude", "startup", "ended: exit 3")]
    assert read("interlude/startup") == [("interlude", "startup", "ended: exit 3")]
    assert read("other/") == []
    # The metadata server refuses a write without the Metadata-Flavor header, as Google's does.
    machine = next(m for m in lc.admin.machines() if m["name"] == "guest")
    url = f"{lc.api_endpoint}/_machines/{machine['id']}/computeMetadata/v1/instance/guest-attributes/a/b"
    assert requests.put(url, data="v", timeout=5).status_code == 403
    tpu.delete_node(name=created.name).result(timeout=10)
