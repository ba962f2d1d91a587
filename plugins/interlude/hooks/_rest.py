"""Raw REST JSON calls to Google APIs (sync and async), with error mapping and bounded retries.

Why raw REST beside the google-cloud-* clients: the ``tpu_v2`` ``Node`` message has no
``upcomingMaintenance`` field and its REST transport drops unknown fields, so reading nodes through the
client would hide exactly what this project watches for. The raw JSON also gives callers the same
camelCase shape Google documents (enum NAMES, not proto numbers) for TPU nodes and Compute instances.
The async client lets triggers poll many machines without blocking the triggerer's event loop.

Credentials only ever travel in the ``Authorization`` header, which is never logged.
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import logging
import weakref
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import google.auth.transport.requests
import requests
from google.auth.credentials import Credentials
from google.auth.transport.requests import AuthorizedSession

from interlude.hooks._retry import RetryPolicy, acall_with_retries, call_with_retries
from interlude.hooks.errors import TransientError, error_from_http

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0


def _decode(content: bytes, text: str) -> Any:
    """The JSON body if there is one, else the text (error pages are not always JSON)."""
    if not content:
        return {}
    try:
        return jsonlib.loads(content)
    except ValueError:
        return text


class RestClient:
    """Blocking JSON-over-HTTP calls through ``google.auth``'s ``AuthorizedSession``."""

    def __init__(self, credentials: Credentials, policy: RetryPolicy, timeout: float = DEFAULT_TIMEOUT):
        self._session = AuthorizedSession(credentials)
        self._policy = policy
        self._timeout = timeout

    def close(self) -> None:
        self._session.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, Any] | None = None,
        json: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Send one request (retrying 429/503 and connection failures); return the decoded JSON body.

        Raises the matching :class:`~interlude.hooks.errors.CloudError` subclass for an error answer.
        """

        def once() -> dict[str, Any]:
            log.debug("%s %s", method, url)
            try:
                resp = self._session.request(method, url, params=params, json=json, timeout=self._timeout)
            except (requests.ConnectionError, requests.Timeout) as exc:
                raise TransientError(f"{method} {url} failed: {exc}", None, "UNAVAILABLE") from exc
            body = _decode(resp.content, resp.text)
            if resp.status_code >= 400:
                raise error_from_http(resp.status_code, body)
            return body if isinstance(body, dict) else {}

        return call_with_retries(once, self._policy, f"{method} {url}")

    def list_all(self, url: str, items_key: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Follow ``nextPageToken`` through every page and return all items."""
        items: list[dict[str, Any]] = []
        query = dict(params or {})
        while True:
            page = self.request("GET", url, params=query)
            items.extend(page.get(items_key) or [])
            token = page.get("nextPageToken")
            if not token:
                return items
            query["pageToken"] = token


_POOL = 32
"""Connections in the shared pool of one event loop (every async hook's calls on it): a trigger runner's calls
are one list per zone and interval plus at most ``MACHINE_READS`` per-machine reads at a time
(interlude.triggers.stage), so 32 never queues a watch; a burst beyond it waits for a free connection."""
_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopSession] = weakref.WeakKeyDictionary()


class _LoopSession:
    """The one aiohttp session (and its connection pool) of an event loop, shared by every AsyncRestClient on it.

    One per loop, not per client: each session holds its own connector, pool and cookie jar, and a triggerer
    runs many hooks on one loop. It is closed by the loop itself when the loop shuts down (``asyncio.run``
    closes every async generator still open, and the session's lifetime is one), so a session nobody closed
    explicitly (the triggers' shared hooks) ends with its loop instead of warning when collected."""

    def __init__(self) -> None:
        # No cookie jar: clients with different credentials share the session, and Google's APIs need none.
        jar = aiohttp.DummyCookieJar()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=_POOL), cookie_jar=jar)
        self.lifetime = self._lifetime(asyncio.get_running_loop())

    async def _lifetime(self, loop: asyncio.AbstractEventLoop) -> AsyncIterator[aiohttp.ClientSession]:
        try:
            yield self.session
        finally:
            await self.session.close()
            if _SESSIONS.get(loop) is self:  # the session holds its loop: the weak key alone would never go
                del _SESSIONS[loop]

    @classmethod
    async def of_running_loop(cls) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        shared = _SESSIONS.get(loop)
        if shared is None or shared.session.closed:
            shared = _SESSIONS[loop] = cls()
            await anext(shared.lifetime)
        return shared.session


async def close_loop_session() -> None:
    """Close the running loop's shared session now (tests; a loop's end closes it anyway)."""
    shared = _SESSIONS.get(asyncio.get_running_loop())
    if shared is not None:
        await shared.lifetime.aclose()  # type: ignore[attr-defined]


def _query(params: dict[str, Any] | None) -> dict[str, Any] | None:
    """Query values as httpx writes them (True -> "true", None -> ""): aiohttp/yarl accept only str and numbers."""
    if not params:
        return None

    def text(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [text(v) for v in value]
        if value is True or value is False:
            return "true" if value else "false"
        return "" if value is None else str(value)

    return {key: text(value) for key, value in params.items()}


def _decode_bytes(content: bytes) -> Any:
    """:func:`_decode` without decoding the text of a JSON body (only an error page that is not JSON needs it)."""
    if not content:
        return {}
    try:
        return jsonlib.loads(content)
    except ValueError:
        return content.decode("utf-8", "replace")


class AsyncRestClient:
    """Non-blocking twin of :class:`RestClient` on aiohttp, through one session per event loop.

    Why aiohttp and not httpx: a trigger runner watching 1,000 quiet stages makes ~1,000 small calls a minute
    on its one event loop, and an aiohttp call costs about a third of an httpx one there (~0.4 vs ~1.2 ms of
    CPU per call, benchmarks/README.md). Why one session per loop: see :class:`_LoopSession`.

    The access token comes from the same ``google.auth`` credentials; refreshing them is a blocking
    HTTP call, so it runs in a worker thread (``asyncio.to_thread``), once for concurrent callers.
    """

    def __init__(self, credentials: Credentials, policy: RetryPolicy, timeout: float = DEFAULT_TIMEOUT):
        self._credentials = credentials
        self._policy = policy
        # httpx's Timeout(60), which this replaced: 60 s to get a connection (waiting for the pool included) and
        # 60 s between reads, no limit on the whole call.
        self._timeout = aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout, sock_read=timeout)
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()

    async def aclose(self) -> None:
        """Nothing of its own to close: the connections belong to the loop's shared session."""

    async def _auth_headers(self) -> dict[str, str]:
        creds = self._credentials
        if not creds.valid:
            lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
            async with lock:
                if not creds.valid:
                    await asyncio.to_thread(creds.refresh, google.auth.transport.requests.Request())
        headers: dict[str, str] = {}
        creds.apply(headers)
        return headers

    async def request(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, Any] | None = None,
        json: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Async :meth:`RestClient.request`: same retries, same exceptions, same return value."""

        async def once() -> dict[str, Any]:
            session = await _LoopSession.of_running_loop()
            headers = await self._auth_headers()
            log.debug("%s %s", method, url)
            try:
                call = session.request(
                    method, url, params=_query(params), json=json, headers=headers, timeout=self._timeout
                )
                async with call as resp:
                    content, status = await resp.read(), resp.status
            except aiohttp.InvalidURL:
                raise
            except (aiohttp.ClientError, TimeoutError) as exc:  # refused, reset, dropped, cut short, timed out
                # str, never repr: a ClientResponseError's repr holds the request's headers (the bearer token).
                why = f"{method} {url} failed: {type(exc).__name__}: {exc}"
                raise TransientError(why, None, "UNAVAILABLE") from exc
            body = _decode_bytes(content)
            if status >= 400:
                raise error_from_http(status, body)
            return body if isinstance(body, dict) else {}

        return await acall_with_retries(once, self._policy, f"{method} {url}")

    async def list_all(self, url: str, items_key: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Follow ``nextPageToken`` through every page and return all items."""
        items: list[dict[str, Any]] = []
        query = dict(params or {})
        while True:
            page = await self.request("GET", url, params=query)
            items.extend(page.get(items_key) or [])
            token = page.get("nextPageToken")
            if not token:
                return items
            query["pageToken"] = token
