"""A counting HTTP reverse proxy: how many calls of each kind a process under test makes.

Why a proxy: the local cloud's admin API has an event log of cloud *events* (creates, maintenance), not
a request counter, and the GCS emulator it runs keeps no log at all. Pointing the triggerer's TPU
endpoint and ``STORAGE_EMULATOR_HOST`` at this proxy counts every call without touching either the
trigger or the local cloud. It runs on 127.0.0.1 in a thread of the benchmark process, so its own CPU
is not billed to the triggerer.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from collections.abc import Callable

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

# Headers that belong to one hop, not to the request/answer being forwarded.
_HOP = {
    "host",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
}

_GCS_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("gcs.download", re.compile(r"^/download/storage/v1/b/[^/]+/o/.+")),
    ("gcs.list_objects", re.compile(r"^/storage/v1/b/[^/]+/o/?$")),
    ("gcs.get_object", re.compile(r"^/storage/v1/b/[^/]+/o/.+")),
    ("gcs.upload", re.compile(r"^/upload/storage/v1/b/")),
    ("gcs.get_bucket", re.compile(r"^/storage/v1/b/[^/]+/?$")),
]


def classify_gcs(method: str, path: str) -> str:
    """Name a GCS JSON API call: list, object metadata get, media download, upload, other."""
    for name, rule in _GCS_RULES:
        if rule.match(path):
            return name if method == "GET" or name == "gcs.upload" else f"{name}.{method}"
    return f"gcs.other.{method}"


def classify_api(method: str, path: str) -> str:
    """Name a TPU/Compute API call by method and resource kind (e.g. ``tpu.GET.nodes``)."""
    family = "compute" if path.startswith("/compute/") else "tpu"
    parts = [p for p in path.split("?")[0].split("/") if p]
    if family == "compute":
        parts = parts[1:]  # drop "compute": then it has the same shape as TPU paths (version first)
    # /v2/projects/P/locations/Z/nodes is a collection (even length), .../nodes/N one item of it.
    if len(parts) < 2:
        return f"{family}.{method}.{'/'.join(parts)}"
    if len(parts) % 2 == 0:
        return f"{family}.{method}.{parts[-1]}"
    return f"{family}.{method}.{parts[-2]}/{parts[-1].split(':', 1)[1] if ':' in parts[-1] else 'ID'}"


class CountingProxy:
    """Forwards every request to ``upstream`` and counts it under ``classify(method, path)``."""

    def __init__(self, upstream: str, classify: Callable[[str, str], str]) -> None:
        self.upstream = upstream.rstrip("/")
        self._upstream_bytes = self.upstream.encode()
        self.classify = classify
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.counts)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        key = self.classify(request.method, request.path)
        with self._lock:
            self.counts[key] += 1
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, headers=headers, data=body or None, allow_redirects=False
        ) as resp:
            data = await resp.read()
            if resp.status >= 400:  # retried or failed calls show up as e.g. "tpu.GET.nodes!503"
                with self._lock:
                    self.counts[f"{key}!{resp.status}"] += 1
            if self._upstream_bytes in data and "json" in resp.headers.get("Content-Type", ""):
                # GCS answers carry absolute mediaLink/selfLink URLs: keep the client's downloads on us.
                data = data.replace(self._upstream_bytes, self.endpoint.encode())
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
            return web.Response(status=resp.status, body=data, headers=out)

    async def _start(self, ready: threading.Event) -> None:
        self._session = ClientSession(
            connector=TCPConnector(limit=64), auto_decompress=False, timeout=ClientTimeout(total=120)
        )
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]
        ready.set()

    def start(self) -> CountingProxy:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.create_task(self._start(ready))
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"proxy-{self.upstream}", daemon=True)
        self._thread.start()
        if not ready.wait(20):
            raise RuntimeError(f"counting proxy for {self.upstream} did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        async def shutdown() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._session is not None:
                await self._session.close()

        asyncio.run_coroutine_threadsafe(shutdown(), loop).result(timeout=20)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        loop.close()
        self._loop = None
