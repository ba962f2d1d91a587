"""Read-only GCS over its JSON API on the event loop: the triggerer's bucket listings and small downloads.

Why not google-cloud-storage in a thread: the triggerer only lists the bucket and downloads a few small JSON
objects, and the storage client's imports (google.cloud.storage, google.api_core with grpc, requests and
google.auth's requests transport) cost its trigger runner ~25 MB before any trigger ran. The TPU/Compute
hooks' small httpx client (:class:`~interlude.hooks._rest.AsyncRestClient`) speaks the JSON API as well.

The endpoint is resolved as google-cloud-storage resolves it: ``STORAGE_EMULATOR_HOST`` (scheme included)
with no credentials, else https://storage.googleapis.com with the application default credentials, as
``interlude_workload.gcs.storage_client`` gives the rest of the project. Requests:
https://cloud.google.com/storage/docs/json_api/v1/objects/list (``matchGlob``, ``fields``, ``pageToken``) and
https://cloud.google.com/storage/docs/json_api/v1/objects/get (``alt=media``, on the ``/download`` path the
storage client uses for media).
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from interlude.hooks._rest import AsyncRestClient
from interlude.hooks._retry import RetryPolicy
from interlude.hooks.errors import NotFoundError

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # interlude_workload.gcs.EMULATOR_ENV (that module imports the storage client)
STORAGE_ENDPOINT = "https://storage.googleapis.com"
READ_ONLY = "https://www.googleapis.com/auth/devstorage.read_only"  # https://cloud.google.com/storage/docs/oauth-scopes
GCS_RETRY = RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=4.0)
"""As the trigger's own calls (triggers.stage.WATCH_RETRY): short, the trigger's outage budget rides out the rest."""
DOWNLOADS = 8
"""At most this many downloads in flight per client (per event loop): a thousand stages reading their facts
at once after a restart would otherwise queue in the HTTP client's pool (see triggers.stage.MACHINE_READS)."""


def endpoint() -> str:
    return (os.environ.get(EMULATOR_ENV) or STORAGE_ENDPOINT).rstrip("/")


class AsyncGcs:
    """Lists objects and downloads them by name; the facts' reader decides what to read."""

    def __init__(self, rest: AsyncRestClient, base: str) -> None:
        self._rest = rest
        self._base = base
        self._downloads = asyncio.Semaphore(DOWNLOADS)

    async def list_pages(
        self, bucket: str, *, prefix: str, match_glob: str, fields: str
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """The listing's JSON items, one page (up to 1,000 objects) at a time."""
        url = f"{self._base}/storage/v1/b/{quote(bucket, safe='')}/o"
        query: dict[str, Any] = {"prefix": prefix, "matchGlob": match_glob, "fields": fields}
        while True:
            page = await self._rest.request("GET", url, params=query)
            yield list(page.get("items") or [])
            token = page.get("nextPageToken")
            if not token:
                return
            query["pageToken"] = token

    async def download(self, bucket: str, name: str) -> bytes | None:
        """The object's bytes (its live generation); None when there is no such object (404)."""
        url = f"{self._base}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
        async with self._downloads:
            try:
                return await self._rest.get_bytes(url, params={"alt": "media"})
            except NotFoundError:
                return None

    async def aclose(self) -> None:
        await self._rest.aclose()


def _credentials(base: str) -> Any:
    """Blocking (ADC may ask the metadata server): none against the emulator, else the default credentials."""
    if base != STORAGE_ENDPOINT:
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials()
    import google.auth

    credentials, _project = google.auth.default(scopes=(READ_ONLY,))
    return credentials


_CLIENTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[AsyncGcs]] = weakref.WeakKeyDictionary()


async def shared_gcs() -> AsyncGcs:
    """One client per event loop, shared by every trigger on it (one HTTP pool, one token); a failed start
    (credentials not found) is tried again by the next caller."""
    loop = asyncio.get_running_loop()
    task = _CLIENTS.get(loop)
    if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
        task = _CLIENTS[loop] = loop.create_task(new_gcs())
    return await asyncio.shield(task)


async def new_gcs(base: str | None = None) -> AsyncGcs:
    """A client of ``base`` (default: :func:`endpoint`); its credentials are loaded in a worker thread."""
    base = (base or endpoint()).rstrip("/")
    credentials = await asyncio.to_thread(_credentials, base)
    return AsyncGcs(AsyncRestClient(credentials, GCS_RETRY), base)
