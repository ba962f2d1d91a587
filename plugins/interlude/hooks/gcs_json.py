"""Read-only GCS over its JSON API with httpx: the triggerer's bucket listings and small downloads.

Why not google-cloud-storage: the triggerer only lists the bucket and downloads a few small JSON objects, and
the storage client's imports (google.cloud.storage, google.api_core with grpc, requests and google.auth's
requests transport) cost its trigger runner ~22 MB before any trigger ran. httpx is already there (the
TPU/Compute async hooks use it). Blocking on purpose: the triggerer calls it from worker threads, as it called
the storage client (the listing in one thread of its own, downloads through ``asyncio.to_thread``): on the
event loop, a thousand stages' first downloads after a restart left the trigger runner ~100 MB larger for
good (one benchmark run, benchmarks/README.md).

The endpoint is resolved as google-cloud-storage resolves it: ``STORAGE_EMULATOR_HOST`` (scheme included) with
no credentials, else https://storage.googleapis.com with the application default credentials, as
``interlude_workload.gcs.storage_client`` gives the rest of the project. Requests:
https://cloud.google.com/storage/docs/json_api/v1/objects/list (``matchGlob``, ``fields``, ``pageToken``) and
https://cloud.google.com/storage/docs/json_api/v1/objects/get (``alt=media``, on the ``/download`` path the
storage client uses for media).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx

from interlude.hooks._rest import DEFAULT_TIMEOUT, _decode, _refresh, shared_ssl_context
from interlude.hooks._retry import RetryPolicy, call_with_retries
from interlude.hooks.errors import NotFoundError, TransientError, error_from_http

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"  # interlude_workload.gcs.EMULATOR_ENV (that module imports the storage client)
STORAGE_ENDPOINT = "https://storage.googleapis.com"
READ_ONLY = "https://www.googleapis.com/auth/devstorage.read_only"  # https://cloud.google.com/storage/docs/oauth-scopes
GCS_RETRY = RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=4.0)
"""As the trigger's own calls (triggers.stage.WATCH_RETRY): short, the trigger's outage budget rides out the rest."""


def endpoint() -> str:
    return (os.environ.get(EMULATOR_ENV) or STORAGE_ENDPOINT).rstrip("/")


class GcsJson:
    """Lists objects and downloads them by name (thread-safe: one client serves every worker thread)."""

    def __init__(self, credentials: Any, base: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._credentials = credentials
        self._base = base.rstrip("/")
        self._http = httpx.Client(timeout=timeout, verify=shared_ssl_context())
        self._token_lock = threading.Lock()

    def _headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        with self._token_lock:
            if not self._credentials.valid:  # anonymous credentials always are: no refresh, no import
                _refresh(self._credentials)
            self._credentials.apply(headers)
        return headers

    def _get(self, url: str, params: dict[str, Any]) -> httpx.Response:
        def once() -> httpx.Response:
            try:
                resp = self._http.get(url, params=params, headers=self._headers())
            except httpx.TransportError as exc:
                raise TransientError(f"GET {url} failed: {exc!r}", None, "UNAVAILABLE") from exc
            if resp.status_code >= 400:
                raise error_from_http(resp.status_code, _decode(resp.content, resp.text))
            return resp

        return call_with_retries(once, GCS_RETRY, f"GET {url}")

    def list_pages(self, bucket: str, *, prefix: str, match_glob: str, fields: str) -> Iterator[list[dict[str, Any]]]:
        """The listing's JSON items, one page (up to 1,000 objects) at a time."""
        url = f"{self._base}/storage/v1/b/{quote(bucket, safe='')}/o"
        query: dict[str, Any] = {"prefix": prefix, "matchGlob": match_glob, "fields": fields}
        while True:
            page = json.loads(self._get(url, query).content)  # bytes straight to JSON: no text copy of the page
            yield list(page.get("items") or [])
            token = page.get("nextPageToken")
            if not token:
                return
            query["pageToken"] = token

    def download(self, bucket: str, name: str) -> bytes | None:
        """The object's bytes (its live generation); None when there is no such object (404)."""
        url = f"{self._base}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"
        try:
            return self._get(url, {"alt": "media"}).content
        except NotFoundError:
            return None

    def close(self) -> None:
        self._http.close()


def new_gcs(base: str | None = None) -> GcsJson:
    """Blocking (ADC may ask the metadata server): a client of ``base`` (default: :func:`endpoint`), anonymous
    unless it is Google's own endpoint."""
    base = (base or endpoint()).rstrip("/")
    if base != STORAGE_ENDPOINT:
        from google.auth.credentials import AnonymousCredentials

        return GcsJson(AnonymousCredentials(), base)
    import google.auth

    credentials, _project = google.auth.default(scopes=(READ_ONLY,))
    return GcsJson(credentials, base)


_SHARED: dict[str, GcsJson] = {}
_SHARED_LOCK = threading.Lock()


def shared_gcs() -> GcsJson:
    """One client per process and endpoint (one pool, one token), as interlude.stage.observe's storage client was."""
    base = endpoint()
    with _SHARED_LOCK:
        if base not in _SHARED:
            _SHARED[base] = new_gcs(base)
        return _SHARED[base]
