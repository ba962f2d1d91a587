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
import functools
import json as jsonlib
import logging
import ssl
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

from interlude.hooks._retry import RetryPolicy, acall_with_retries, call_with_retries
from interlude.hooks.errors import TransientError, error_from_http

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """The one TLS context every httpx client of this process verifies Google's certificates with.

    Why: httpx builds a new context for each client (``verify=True``: certifi's CA bundle parsed again, ~20 ms
    of CPU measured here), and a trigger makes a client per event loop it runs in; `airflow dags test` runs
    each deferral in a new loop. A context holds only settings and the CA store, and may serve any number of
    connections, threads and loops. ``httpx.create_ssl_context`` keeps httpx's own choice of CA bundle
    (``SSL_CERT_FILE``/``SSL_CERT_DIR``, else certifi's).
    """
    return httpx.create_ssl_context()


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
        from google.auth.transport.requests import AuthorizedSession

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

        import requests

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


class AsyncRestClient:
    """Non-blocking twin of :class:`RestClient` on ``httpx.AsyncClient``.

    The access token comes from the same ``google.auth`` credentials; refreshing them is a blocking
    HTTP call, so it runs in a worker thread (``asyncio.to_thread``), once for concurrent callers.
    The refresh goes through google.auth's urllib3 transport, imported only then: anonymous credentials (the
    local cloud's) never refresh and import nothing, and urllib3 costs the trigger runner ~1 MB where the
    requests transport costs ~6 MB (benchmarks/README.md, issue 16).
    """

    def __init__(self, credentials: Credentials, policy: RetryPolicy, timeout: float = DEFAULT_TIMEOUT):
        self._credentials = credentials
        self._policy = policy
        self._timeout = timeout
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refresh_lock: asyncio.Lock | None = None

    def _http(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            # An httpx client belongs to the loop it was first used on; triggers may run in a new one.
            self._client = httpx.AsyncClient(timeout=self._timeout, verify=shared_ssl_context())
            self._loop = loop
            self._refresh_lock = asyncio.Lock()
        return self._client

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None
        self._loop = None

    async def _auth_headers(self) -> dict[str, str]:
        creds = self._credentials
        if not creds.valid:
            assert self._refresh_lock is not None
            async with self._refresh_lock:
                if not creds.valid:
                    await asyncio.to_thread(_refresh, creds)
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
        resp = await self._send(method, url, params=params, json=json)
        body = _decode(resp.content, resp.text)
        return body if isinstance(body, dict) else {}

    async def get_bytes(self, url: str, *, params: dict[str, Any] | None = None) -> bytes:
        """GET a body as bytes (a media download), with :meth:`request`'s retries and exceptions."""
        return (await self._send("GET", url, params=params)).content

    async def _send(
        self,
        method: str,
        url: str,
        *,
        params: dict[str, Any] | None = None,
        json: dict[str, Any] | None = None,
    ) -> httpx.Response:
        async def once() -> httpx.Response:
            client = self._http()
            headers = await self._auth_headers()
            log.debug("%s %s", method, url)
            try:
                resp = await client.request(method, url, params=params, json=json, headers=headers)
            except httpx.TransportError as exc:
                raise TransientError(f"{method} {url} failed: {exc!r}", None, "UNAVAILABLE") from exc
            if resp.status_code >= 400:
                raise error_from_http(resp.status_code, _decode(resp.content, resp.text))
            return resp

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


def _refresh(credentials: Credentials) -> None:
    """Blocking: a token refresh through google.auth's urllib3 transport (imported here, see AsyncRestClient).
    https://googleapis.dev/python/google-auth/latest/reference/google.auth.transport.urllib3.html"""
    import urllib3
    from google.auth.transport.urllib3 import Request

    with urllib3.PoolManager() as http:
        credentials.refresh(Request(http))
