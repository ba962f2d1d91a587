"""Per-machine metadata server (`/_machines/<id>/computeMetadata/v1/...`), as a guest sees it.

Mirrors metadata.google.internal: `Metadata-Flavor: Google` required, text values, `?alt=json`,
and `?wait_for_change=true` long-polls keyed by ETag so a workload can block until maintenance news.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from interlude_localcloud.cloud import Cloud, Machine, rfc3339
from interlude_localcloud.errors import ApiError
from interlude_localcloud.server import ClientGone, Request, Response, Router
from interlude_localcloud.slices import Worker, worker_attributes


class MetadataApi:
    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    def register(self, r: Router) -> None:
        r.add("GET", r"/_machines/(?P<mid>[^/]+)/computeMetadata/v1/(?P<key>.*)", self.get)
        r.add("PUT", GUEST_PATH, self.put_guest_attribute, text_body=True)

    def _value(self, mid: str, key: str, alt_json: bool) -> str | None:
        """The metadata value at ``key`` for the machine (or slice worker) ``mid`` (None: 404), as Google's
        metadata server answers it. Maintenance news and guest attributes are the worker's own."""
        found = self.cloud.host_by_id(mid)
        if found is None:
            return None
        m, h, index = found
        key = key.rstrip("/") if key.endswith("/") and key != "instance/attributes/" else key
        simple = {
            "instance/maintenance-event": lambda: h.maintenance_event,
            "instance/preempted": lambda: "TRUE" if m.preempted else "FALSE",
            "instance/upcoming-maintenance": lambda: json.dumps(_upcoming(h)),
            "instance/name": lambda: m.name,
            "instance/id": lambda: str(m.resource.get("id", "")),
            "instance/zone": lambda: f"projects/{self.cloud.scenario.project}/zones/{m.zone}",
            "project/project-id": lambda: self.cloud.scenario.project,
        }
        if key in simple:
            return simple[key]()
        attrs = m.attributes()
        if m.kind == "tpu":  # a TPU VM's own attributes beside the node's metadata (every worker, as on Google)
            attrs = {**attrs, **worker_attributes(m, index)}
        if key == "instance/attributes/":
            return json.dumps(attrs) if alt_json else "".join(f"{k}\n" for k in sorted(attrs))
        if key.startswith("instance/attributes/"):
            return attrs.get(key.removeprefix("instance/attributes/"))
        if key.startswith("instance/guest-attributes/"):
            return h.guest_attributes.get(key.removeprefix("instance/guest-attributes/"))
        return None

    def put_guest_attribute(self, req: Request) -> Response:
        """The guest writes `instance/guest-attributes/NAMESPACE/KEY` (the body is the value), as on Google
        (https://cloud.google.com/compute/docs/metadata/manage-guest-attributes); TPU VMs' guest attributes
        are read back through the TPU API's nodes.getGuestAttributes."""
        if req.headers.get("Metadata-Flavor", req.headers.get("metadata-flavor")) != "Google":
            raise ApiError(403, "Missing Metadata-Flavor:Google header.", "PERMISSION_DENIED")
        value = req.raw_body.decode(errors="replace") if req.raw_body else ""
        with self.cloud.lock:
            found = self.cloud.host_by_id(req.params["mid"])
            if found is None:
                raise ApiError(404, "Not Found", "NOT_FOUND")
            found[1].guest_attributes[f"{req.params['ns']}/{req.params['key']}"] = value[:GUEST_VALUE_MAX]
        return Response(None, raw=b"", headers={"Content-Type": "text/plain", "Metadata-Flavor": "Google"})

    def get(self, req: Request) -> Response:
        if req.headers.get("Metadata-Flavor", req.headers.get("metadata-flavor")) != "Google":
            raise ApiError(403, "Missing Metadata-Flavor:Google header.", "PERMISSION_DENIED")
        key = req.params["key"]
        alt_json = req.query.get("alt") == "json"
        wait = req.query.get("wait_for_change", "").lower() == "true"
        timeout = float(req.query.get("timeout_sec", "60") or 60)
        last = req.query.get("last_etag")
        deadline = time.time() + min(timeout, 300.0)
        with self.cloud.lock:
            value = self._value(req.params["mid"], key, alt_json)
            if value is None:
                raise ApiError(404, "Not Found", "NOT_FOUND")
            etag = _etag(value)
            if wait:
                target = last or etag
                while etag == target and time.time() < deadline:
                    if req.client_gone():  # a killed guest: stop holding a thread for it
                        raise ClientGone(f"metadata long-poll client for {key} went away")
                    self.cloud.changed.wait(timeout=max(0.0, min(0.5, deadline - time.time())))
                    new = self._value(req.params["mid"], key, alt_json)
                    if new is None:
                        break
                    value, etag = new, _etag(new)
        ctype = "application/json" if key == "instance/upcoming-maintenance" or alt_json else "text/plain"
        return Response(
            None, raw=value.encode(), headers={"ETag": etag, "Content-Type": ctype, "Metadata-Flavor": "Google"}
        )


GUEST_PATH = r"/_machines/(?P<mid>[^/]+)/computeMetadata/v1/instance/guest-attributes/(?P<ns>[^/]+)/(?P<key>[^/]+)"
GUEST_VALUE_MAX = 100 * 1024


def _etag(value: str) -> str:
    return hashlib.md5(value.encode()).hexdigest()[:16]


def _upcoming(m: Machine | Worker) -> dict[str, Any]:
    """`instance/upcoming-maintenance?alt=json`: snake_case, `{}` when none is scheduled."""
    mt = m.maintenance
    if mt is None:
        return {}
    return {
        "type": mt["type"],
        "can_reschedule": mt["can_reschedule"],
        "window_start_time": rfc3339(mt["start"]),
        "window_end_time": rfc3339(mt["end"]),
        "latest_window_start_time": rfc3339(max(mt["latest"], mt["start"])),
        "maintenance_status": mt["status"],
    }
