"""`?watch=true` streams: newline-delimited `{"type", "object"}` events, as the API server sends them.

A label-selector watch sees an object leave the selection as DELETED and enter it as ADDED, and a
too-old resourceVersion as an ERROR event carrying a 410 Status (what the clients' Watch helpers
expect, https://kubernetes.io/docs/reference/using-api/api-concepts/#410-gone-responses).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from interlude_localcloud.gke.resources import ResourceType
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store, WatchEvent

Predicate = Callable[[dict[str, Any]], bool]


def _line(etype: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": etype, "object": obj}).encode() + b"\n"


def _ident(obj: dict[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class _Selection:
    """Turns store events into the events a selective watcher must see."""

    def __init__(self, pred: Predicate) -> None:
        self.pred = pred
        self.inside: set[tuple[str, str]] = set()

    def translate(self, ev: WatchEvent) -> bytes | None:
        ident = _ident(ev.object)
        matches = self.pred(ev.object)
        was = ident in self.inside
        if ev.type == "DELETED":
            self.inside.discard(ident)
            return _line("DELETED", ev.object) if was or matches else None
        if matches:
            self.inside.add(ident)
            return _line("MODIFIED" if was and ev.type == "MODIFIED" else "ADDED", ev.object)
        if was:
            self.inside.discard(ident)
            return _line("DELETED", ev.object)
        return None


async def stream(
    store: Store, rt: ResourceType, namespace: str | None, since: str | None, pred: Predicate, timeout: float
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[WatchEvent] = asyncio.Queue()

    def push(ev: WatchEvent) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, ev)
        except RuntimeError:  # the server's loop is gone: nobody is listening any more
            pass

    try:
        first, unsubscribe = store.watch(rt, namespace, since, push)
    except KubeError as e:
        yield _line("ERROR", e.status())
        return
    selection = _Selection(pred)
    if since and since != "0":  # resuming: the client already has the objects that matched then
        items, _ = store.list(rt, namespace, pred)
        selection.inside = {_ident(o) for o in items}
    try:
        for ev in first:
            if (line := selection.translate(ev)) is not None:
                yield line
        deadline = loop.time() + timeout
        while (remaining := deadline - loop.time()) > 0:
            try:
                ev = await asyncio.wait_for(queue.get(), timeout=min(remaining, 1.0))
            except TimeoutError:
                continue
            if (line := selection.translate(ev)) is not None:
                yield line
    finally:
        unsubscribe()
