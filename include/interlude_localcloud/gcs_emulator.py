"""gcp-storage-emulator with GCS's write preconditions: ``python -m interlude_localcloud.gcs_emulator start ...``.

The emulator ignores ``ifGenerationMatch`` on object inserts and deletes; Google honours it and answers
412 conditionNotMet (https://cloud.google.com/storage/docs/request-preconditions). Interlude relies on it
(``ifGenerationMatch=0``: create only if absent, for machine slots), so the local GCS must too: the
emulator's own insert and delete handlers are wrapped with the check, under one lock so that check and
write are atomic as they are on Google.

The emulator also rewrites its whole state file (every object's metadata, as indented JSON) after every write:
O(objects) per write, so a bucket of a thousand training stages rewriting their progress every few seconds
saturated it at ~15 writes/s, where GCS takes thousands. Here that file is written at most every
``FLUSH_SECONDS`` (by a flusher thread, between requests), and on SIGTERM before the emulator exits: what a
stopped local cloud leaves on disk is complete, as before; only a SIGKILL can lose the last fraction of a second.

And it answers partial responses as Google's front end does (``fields``, interlude_localcloud.partial): the
emulator ignored the parameter and sent every object's whole resource, ~4x more JSON per listing than GCS sends
a watcher that asks for five fields, which made a triggerer here parse more than it would on Google. A malformed
selection is a 400. (Field names are not checked against a schema here: no storage discovery document is kept.)
Reads and listings answer as Google's JSON API does (interlude_localcloud.gcs_reads): the emulator
sent a download without ``x-goog-generation``, ignored read preconditions, suffix ranges and ``startOffset``/
``endOffset``/``maxResults``/``pageToken``. tensorstore (Orbax's array store) needs each: it takes a download's
generation from that header and builds its next conditional write on it, re-reads OCDBT manifests with
``ifGenerationNotMatch`` expecting 304, and lists a key range only through the offsets (ignored, a prefix's
DeleteRange would have listed -- and deleted -- the whole bucket).
And it answers ``Expect: 100-continue`` at once, as Google's front end does (RFC 9110 section 10.1.1): the emulator's
HTTP/1.0 handler ignored it, so libcurl (tensorstore's HTTP client) waited its full one-second timeout before
sending any upload body over 1 MB -- a second per array chunk, 1-3 s per Orbax save of a 22 MB state that GCS
takes in well under one.
Everything else is the emulator's, unchanged.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gcp_storage_emulator import __main__ as emulator_main
from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects
from gcp_storage_emulator.storage import Storage

from interlude_localcloud import gcs_reads, partial

_LOCK = threading.Lock()
_NOT_MET = {
    "error": {
        "code": 412,
        "message": "At least one of the pre-conditions you specified did not hold.",
        "errors": [{"domain": "global", "reason": "conditionNotMet", "message": "Precondition Failed"}],
    }
}
Handler = Callable[..., Any]


def _object_name(request: Any) -> str | None:
    if "object_id" in request.params:
        return str(request.params["object_id"])
    if "name" in request.query:
        return str(request.query["name"][0])
    data = request.data
    if isinstance(data, dict) and isinstance(data.get("meta"), dict):
        return data["meta"].get("name")
    return None


def _generation(storage: Any, bucket: str, name: str) -> str:
    try:
        return str(storage.get_file_obj(bucket, name).get("generation") or "0")
    except NotFound:
        return "0"  # GCS: generation 0 means "no live object"


def with_preconditions(handler: Handler) -> Handler:
    def wrapped(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = (request.query.get("ifGenerationMatch") or [None])[0]
        name = _object_name(request)
        if wanted is None or name is None:
            return handler(request, response, storage, *args, **kwargs)
        with _LOCK:
            if _generation(storage, request.params["bucket_name"], name) != str(wanted):
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json(_NOT_MET)
                return None
            return handler(request, response, storage, *args, **kwargs)

    return wrapped


def patch_handlers() -> None:
    """Swap the emulator's insert/delete handlers (in its routing table) for the precondition-aware ones."""
    wrapped = {objects.insert: with_preconditions(objects.insert), objects.delete: with_preconditions(objects.delete)}
    for _pattern, methods in server.HANDLERS:
        for method, handler in list(methods.items()):
            if handler in wrapped:
                methods[method] = wrapped[handler]
    objects.insert = wrapped[objects.insert]  # the router's own fallback for uploads POSTed without /upload


def honour_fields() -> None:
    """JSON answers narrowed to the request's ``fields`` (errors never are); a malformed one is a 400."""
    send = server.Response.json

    def json_answer(self: Any, obj: Any) -> None:
        spec = (parse_qs(urlsplit(self._handler.path).query).get("fields") or [None])[0]
        if spec is None or not isinstance(obj, dict) or "error" in obj:
            return send(self, obj)
        try:
            return send(self, partial.select(obj, partial.parse(spec)))
        except partial.FieldsError as exc:
            self.status = HTTPStatus.BAD_REQUEST
            error = {"domain": "global", "reason": "invalidParameter", "message": str(exc)}
            return send(self, {"error": {"code": 400, "message": str(exc), "errors": [error]}})

    server.Response.json = json_answer  # type: ignore[method-assign]


FLUSH_SECONDS = 0.5
_STATE = threading.Lock()  # held while a request is handled, and by a flush (no dump of a dict being changed)


class _Flusher:
    """The state file written from the latest state, at most every FLUSH_SECONDS, and at exit."""

    def __init__(self, write: Callable[[Any], None]) -> None:
        self.write = write
        self.storage: Any = None  # the Storage with unwritten changes (the emulator has one)

    def changed(self, storage: Any) -> None:  # in place of Storage._write_config_to_file, under _STATE
        self.storage = storage

    def flush(self) -> None:
        with _STATE:
            storage, self.storage = self.storage, None
            if storage is not None:
                self.write(storage)

    def run(self) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            self.flush()


def debounce_state_file() -> _Flusher:
    """Every request under _STATE; the state file written by a flusher thread and on SIGTERM (then the server
    stops as on Ctrl-C)."""
    flusher = _Flusher(Storage._write_config_to_file)

    def changed(storage: Any) -> None:
        flusher.changed(storage)

    Storage._write_config_to_file = changed  # type: ignore[method-assign]
    handle = server.Router.handle

    def one_request(self: Any, method: Any) -> Any:  # the routing of one request read off its connection
        with _STATE:
            return handle(self, method)

    server.Router.handle = one_request  # type: ignore[method-assign]
    threading.Thread(target=flusher.run, name="gcs-state-flusher", daemon=True).start()

    def on_sigterm(signum: int, frame: Any) -> None:
        flusher.flush()
        raise KeyboardInterrupt  # the emulator's own way out: its server loop stops the HTTP thread

    signal.signal(signal.SIGTERM, on_sigterm)
    return flusher


def answer_expect_continue() -> None:
    """Send ``100 Continue`` when an HTTP/1.1 request asks for it (http.server does so only for HTTP/1.1 servers)."""
    parse = server.RequestHandler.parse_request

    def parse_request(self: Any) -> bool:
        ok = bool(parse(self))
        expects = (self.headers.get("Expect") or "").lower() == "100-continue" if ok else False
        if expects and self.request_version >= "HTTP/1.1" and self.protocol_version < "HTTP/1.1":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.wfile.flush()
        return ok

    server.RequestHandler.parse_request = parse_request  # type: ignore[method-assign]


if __name__ == "__main__":
    answer_expect_continue()
    patch_handlers()
    gcs_reads.patch_reads()
    honour_fields()
    debounce_state_file()
    emulator_main.main()
