"""Small read-only HTML pages of the local cloud: what Google's console shows for a machine or a GCS folder.

Interlude's extra links point here when a run ran on the local cloud (on Google they point at the
console), so a person following a link from the Airflow UI sees the machine or the checkpoints of *that*
run. Read-only GETs under `/_localcloud/pages/`; every value is HTML-escaped (names, labels and the
serial log come from users and workloads).

    /_localcloud/pages/machines/{tpu|gce}/{zone}/{name}   name, zone, type, state, labels, upcoming
                                                           maintenance, the serial log's tail; a deleted
                                                           machine shows its event history instead
    /_localcloud/pages/gcs/{bucket}/{prefix...}          objects under gs://bucket/prefix with size, and
                                                           whether each checkpoint step is committed (Orbax
                                                           finalised it: its commit_success.txt is there)
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from html import escape
from typing import Any

from interlude_localcloud.cloud import Cloud, Machine
from interlude_localcloud.server import Request, Response, Router

SERIAL_TAIL_LINES = 40
MAX_OBJECTS = 5000
# https://cloud.google.com/storage/docs/buckets#naming (lowercase letters, digits, -, _ and .; 3-222 chars)
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
STEP_RE = re.compile(r"^(?P<step>(?:.*/)?checkpoints/\d+/)")  # Orbax's step dirs (interlude_workload.orbax_layout)
COMMITTED = "commit_success.txt"  # Orbax's last write of a step on GCS: the step is finalised

_STYLE = (
    "body{font-family:sans-serif;margin:2em;color:#202124}table{border-collapse:collapse}"
    "td,th{border:1px solid #dadce0;padding:4px 8px;text-align:left;vertical-align:top}"
    "th{background:#f1f3f4}pre{background:#f8f9fa;padding:1em;overflow:auto;max-height:30em}"
    ".yes{color:#188038;font-weight:bold}.no{color:#a50e0e}"
)


@dataclass(frozen=True)
class GcsObject:
    name: str
    size: int


def html_page(title: str, body: str, status: int = 200) -> Response:
    """One complete HTML document; `title` is escaped here, `body` must be escaped by the caller."""
    doc = (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>{body}"
        "<p><small>Interlude local cloud (read-only page)</small></p></body></html>"
    )
    return Response(None, status=status, raw=doc.encode(), headers={"Content-Type": "text/html; charset=utf-8"})


def table(rows: Iterable[tuple[str, str]]) -> str:
    """Rows of (label, already-escaped HTML)."""
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def machine_type(m: Machine) -> str:
    if m.kind == "tpu":
        return str(m.resource.get("acceleratorType", ""))
    return str(m.resource.get("machineType", "")).rsplit("/", 1)[-1]


def serial_tail(m: Machine, lines: int = SERIAL_TAIL_LINES) -> str:
    try:
        text = m.proc.serial_log.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def committed_steps(objects: Iterable[GcsObject]) -> set[str]:
    """The step folders (`.../checkpoints/10/`) that hold Orbax's commit marker."""
    out = set()
    for o in objects:
        step = STEP_RE.match(o.name)
        if step is not None and o.name == step.group("step") + COMMITTED:
            out.add(step.group("step"))
    return out


class Pages:
    """Registers the page routes; reads the cloud's state under its lock, GCS through its JSON API."""

    def __init__(self, cloud: Cloud) -> None:
        self.cloud = cloud

    def register(self, r: Router) -> None:
        r.add(
            "GET",
            r"/_localcloud/pages/machines/(?P<kind>tpu|gce)/(?P<zone>[a-z0-9-]+)/(?P<name>[a-z0-9-]+)",
            self.machine,
        )
        r.add("GET", r"/_localcloud/pages/gcs/(?P<bucket>[^/]+)/?(?P<prefix>.*)", self.folder)

    # ------------------------------------------------------------------ machines
    def machine(self, req: Request) -> Response:
        kind, zone, name = req.params["kind"], req.params["zone"], req.params["name"]
        title = f"{'TPU node' if kind == 'tpu' else 'VM instance'} {name}"
        with self.cloud.lock:
            m = self.cloud.machines.get((kind, zone, name))
            if m is not None:
                return html_page(title, self._live_machine(m))
            history = [e for e in self.cloud.events if e.get("machine") == f"{kind}-{zone}-{name}"]
        if not history:
            return html_page(title, f"<p>No machine {escape(name)} in {escape(zone)}.</p>", status=404)
        rows = "".join(
            f"<tr><td>{escape(str(e.get('time', '')))}</td><td>{escape(str(e.get('event', '')))}</td>"
            f"<td>{escape(json.dumps({k: v for k, v in e.items() if k not in ('t', 'time', 'event')}))}"
            "</td></tr>"
            for e in history
        )
        body = (
            table([("Name", escape(name)), ("Zone", escape(zone)), ("State", "DELETED")])
            + "<h2>History</h2><table><tr><th>Time</th><th>Event</th><th>Details</th></tr>"
            + rows
            + "</table>"
        )
        return html_page(title, body)

    def _live_machine(self, m: Machine) -> str:
        labels = m.resource.get("labels") or {}
        label_html = "<br>".join(f"{escape(str(k))}={escape(str(v))}" for k, v in sorted(labels.items())) or "-"
        upcoming = self.cloud.upcoming(m)
        rows = [
            ("Name", escape(m.name)),
            ("Zone", escape(m.zone)),
            ("Type", escape(machine_type(m))),
            ("State", escape(str(m.resource.get("state") or m.resource.get("status") or ""))),
            ("Spot", "yes" if m.spot else "no"),
            ("Labels", label_html),
            ("Upcoming maintenance", escape(json.dumps(upcoming, sort_keys=True)) if upcoming else "none"),
        ]
        return table(rows) + "<h2>Serial port output (tail)</h2><pre>" + escape(serial_tail(m)) + "</pre>"

    # ------------------------------------------------------------------ GCS folders
    def folder(self, req: Request) -> Response:
        bucket, prefix = req.params["bucket"], req.params.get("prefix") or ""
        title = f"gs://{bucket}/{prefix}"
        if not BUCKET_RE.match(bucket):
            return html_page(title, "<p>Not a bucket name.</p>", status=400)
        try:
            objects = self.list_objects(bucket, prefix)
        except urllib.error.HTTPError as e:
            return html_page(title, f"<p>Cloud Storage answered {e.code}.</p>", status=e.code)
        steps = committed_steps(objects)
        rows = []
        for o in objects:
            step = STEP_RE.match(o.name)
            committed = (
                ""
                if step is None
                else (
                    "<span class='yes'>COMMITTED</span>"
                    if step.group("step") in steps
                    else "<span class='no'>not committed</span>"
                )
            )
            rows.append(f"<tr><td>{escape(o.name[len(prefix) :])}</td><td>{o.size}</td><td>{committed}</td></tr>")
        body = (
            f"<p>{len(objects)} objects, {len(steps)} committed checkpoint steps.</p>"
            "<table><tr><th>Object</th><th>Size (bytes)</th><th>Checkpoint</th></tr>" + "".join(rows) + "</table>"
        )
        return html_page(title, body)

    def list_objects(self, bucket: str, prefix: str) -> list[GcsObject]:
        """objects.list of the JSON API (https://cloud.google.com/storage/docs/json_api/v1/objects/list)."""
        out: list[GcsObject] = []
        token = ""
        while len(out) < MAX_OBJECTS:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            url = (
                f"{self.cloud.gcs_endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?"
                + urllib.parse.urlencode(query)
            )
            with urllib.request.urlopen(url, timeout=30) as resp:
                page: dict[str, Any] = json.loads(resp.read())
            out += [GcsObject(str(i["name"]), int(i.get("size", 0))) for i in page.get("items", [])]
            token = str(page.get("nextPageToken") or "")
            if not token:
                break
        return sorted(out, key=lambda o: o.name)
