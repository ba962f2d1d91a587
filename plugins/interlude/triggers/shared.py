"""Calls shared by every trigger in one triggerer process: one in-flight or recent call per key.

A thousand watchers of one zone (or one bucket) cost one call per interval, not a thousand: the first
watcher whose copy is older than its max age starts the call, everyone else awaits the same task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from interlude.stage.observe import watched_fields

T = TypeVar("T")
_ListFn = Callable[[], Awaitable[list[dict[str, Any]]]]


class SharedCalls(Generic[T]):
    """The latest result per key, refetched when older than the caller's max age or when it failed."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, ...], tuple[float, asyncio.Task[T]]] = {}
        self.calls = 0

    async def get(
        self, key: tuple[str, ...], fetch: Callable[[], Awaitable[T]], max_age: float, not_before: float = 0.0
    ) -> T:
        """``not_before`` (monotonic): a call started earlier is too old whatever its age. A trigger passes its
        own start: a list fetched before it was deferred may predate what the worker saw just before (a notice,
        a machine down), and reading it would step the stage back."""
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is None or now - entry[0] > max_age or entry[0] < not_before or _failed(entry[1]):
            self.calls += 1
            entry = (now, asyncio.ensure_future(fetch()))
            self._entries[key] = entry
        return await asyncio.shield(entry[1])


def _failed(task: asyncio.Task[Any]) -> bool:
    return task.done() and task.exception() is not None


class ZoneListCache:
    """One list call per (api, endpoint, zone) and interval, indexed by short name once per fetch (not
    scanned by every watcher). The fetch asks the API for the fields a watcher reads (``observe.list_fields``);
    an API that sends more is narrowed here, so a list held by a thousand watchers stays small either way."""

    def __init__(self) -> None:
        self._shared: SharedCalls[dict[str, dict[str, Any]]] = SharedCalls()

    @property
    def calls(self) -> int:
        return self._shared.calls

    async def get(
        self, key: tuple[str, ...], fetch: _ListFn, max_age: float, not_before: float = 0.0
    ) -> dict[str, dict[str, Any]]:
        async def fetch_indexed() -> dict[str, dict[str, Any]]:
            return {item.get("name", "").rsplit("/", 1)[-1]: watched_fields(item) for item in await fetch()}

        return await self._shared.get(key, fetch_indexed, max_age, not_before)
