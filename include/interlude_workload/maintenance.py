"""Watch the machine's metadata server for maintenance and preemption notices.

Google tells a VM (and each TPU worker) about coming trouble only through its metadata server:
``instance/maintenance-event`` turns from NONE to TERMINATE_ON_HOST_MAINTENANCE (about 60 s ahead on
ordinary VMs, an hour on GPU VMs), ``instance/upcoming-maintenance?alt=json`` carries the scheduled
window (snake_case JSON, ``{}`` when none) and ``instance/preempted`` turns TRUE on a spot preemption.
Each is long-polled with ``?wait_for_change=true`` and ``last_etag`` from its own daemon thread, so a
notice is seen within one request round trip rather than a polling interval.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

DEFAULT_METADATA_URL = "http://metadata.google.internal/computeMetadata/v1"
METADATA_ENV = "INTERLUDE_METADATA_URL"
WATCHED = ("instance/maintenance-event", "instance/upcoming-maintenance", "instance/preempted")


def metadata_url_from_env() -> str:
    return os.environ.get(METADATA_ENV) or DEFAULT_METADATA_URL


def parse_rfc3339(value: str | None) -> datetime | None:
    """RFC3339 (``Z`` or offset, optional fractions) to an aware datetime; None when absent/unparsable."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass
class Notice:
    """What the metadata server currently says; ``active`` when any of it means trouble is coming."""

    maintenance_event: str = "NONE"
    upcoming: dict[str, object] = field(default_factory=dict)
    preempted: bool = False

    @property
    def active(self) -> bool:
        return self.maintenance_event not in ("", "NONE") or bool(self.upcoming) or self.preempted

    @property
    def window_start(self) -> datetime | None:
        value = self.upcoming.get("window_start_time") if self.upcoming else None
        return parse_rfc3339(value if isinstance(value, str) else None)

    @property
    def imminent(self) -> bool:
        """Going down soon with no later window announced: TERMINATE event or a preemption."""
        return self.preempted or self.maintenance_event not in ("", "NONE")

    def describe(self) -> str:
        parts = []
        if self.maintenance_event not in ("", "NONE"):
            parts.append(f"maintenance-event={self.maintenance_event}")
        if self.upcoming:
            parts.append("upcoming-maintenance=" + json.dumps(self.upcoming, sort_keys=True))
        if self.preempted:
            parts.append("preempted=TRUE")
        return ", ".join(parts) or "none"


class MaintenanceWatcher:
    """Background long-polls of the three endpoints; calls ``on_change(notice)`` after every change."""

    def __init__(
        self,
        base_url: str,
        on_change: Callable[[Notice], None],
        log: Callable[[str], None] = print,
        wait_timeout_sec: int = 60,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.on_change = on_change
        self.log = log
        self.wait_timeout_sec = wait_timeout_sec
        self.notice = Notice()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._unreachable_logged = False

    def start(self) -> None:
        for path in WATCHED:
            thread = threading.Thread(target=self._watch, args=(path,), name=f"metadata:{path}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()

    def _get(self, path: str, etag: str | None, wait: bool) -> tuple[str, str | None]:
        query: dict[str, str] = {}
        if path.endswith("upcoming-maintenance"):
            query["alt"] = "json"
        if wait:
            query["wait_for_change"] = "true"
            query["timeout_sec"] = str(self.wait_timeout_sec)
            if etag:
                query["last_etag"] = etag
        url = f"{self.base_url}/{path}" + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=self.wait_timeout_sec + 10) as response:
            return response.read().decode("utf-8", "replace"), response.headers.get("ETag")

    def _apply(self, path: str, body: str) -> None:
        with self._lock:
            before = (self.notice.maintenance_event, dict(self.notice.upcoming), self.notice.preempted)
            if path.endswith("maintenance-event"):
                self.notice.maintenance_event = body.strip() or "NONE"
            elif path.endswith("upcoming-maintenance"):
                try:
                    value = json.loads(body) if body.strip() else {}
                except ValueError:
                    value = {}
                self.notice.upcoming = value if isinstance(value, dict) else {}
            else:
                self.notice.preempted = body.strip().upper() == "TRUE"
            after = (self.notice.maintenance_event, dict(self.notice.upcoming), self.notice.preempted)
            snapshot = Notice(after[0], after[1], after[2])
        if after != before:
            self.on_change(snapshot)

    def _watch(self, path: str) -> None:
        etag: str | None = None
        wait = False  # first read the current value, then wait for changes
        failures = 0
        while not self._stop.is_set():
            try:
                started = time.monotonic()
                previous_etag = etag
                body, etag = self._get(path, etag, wait)
                failures = 0
                self._apply(path, body)
                if wait and etag == previous_etag and time.monotonic() - started < 0.05:
                    self._stop.wait(0.5)  # a server that ignores wait_for_change must not spin us
                wait = True
            except urllib.error.HTTPError as exc:
                failures += 1
                if failures == 1:
                    self.log(f"metadata {path}: HTTP {exc.code}; retrying")
                self._stop.wait(min(30.0, 0.5 * 2**failures))
                wait = False
            except (OSError, ValueError) as exc:
                failures += 1
                if failures == 1 and not self._unreachable_logged:
                    self._unreachable_logged = True
                    self.log(f"metadata server {self.base_url} unreachable ({exc}); no notices until it answers")
                self._stop.wait(min(30.0, 0.5 * 2**failures))
                wait = False
