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


def translate(ev: WatchEvent, pred: Predicate) -> bytes | None:
    """The event a watcher with this selection sees, from the object before and after the change.

    As the API server's watch cache decides it: a change that keeps the object selected is MODIFIED,
    one that brings it in is ADDED, one that takes it out is DELETED (carrying the new state). Replays
    from a resourceVersion use the recorded types, so a resumed watch sees what a live one saw.
    """
    now = pred(ev.object)
    if ev.type == "ADDED":
        return _line("ADDED", ev.object) if now else None
    before = ev.prev is not None and pred(ev.prev)
    if ev.type == "DELETED":
        return _line("DELETED", ev.object) if before or now else None
    if now:
        return _line("MODIFIED" if before else "ADDED", ev.object)
    return _line("DELETED", ev.object) if before else None


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
    try:
        for ev in first:
            if (line := translate(ev, pred)) is not None:
                yield line
        deadline = loop.time() + timeout
        while (remaining := deadline - loop.time()) > 0:
            try:
                ev = await asyncio.wait_for(queue.get(), timeout=min(remaining, 1.0))
            except TimeoutError:
                continue
            if (line := translate(ev, pred)) is not None:
                yield line
    finally:
        unsubscribe()
