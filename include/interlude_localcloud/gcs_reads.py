"""Object reads and listings of the local GCS, answered as Google's JSON API answers them.

gcp-storage-emulator's own handlers differ from Google where Orbax's array store (tensorstore's ``gcs`` kvstore)
and gcsfs depend on Google:

- A media download (``alt=media``) carries the object's generation and metageneration as ``x-goog-generation``
  and ``x-goog-metageneration``, and its stored size as ``x-goog-stored-content-length``
  (https://cloud.google.com/storage/docs/xml-api/reference-headers). tensorstore reads the generation of what it
  downloaded from that header and nowhere else; without it the generation is 0 and the next conditional write of
  an OCDBT manifest is refused in the client ("Malformed StorageGeneration").
- ``objects.get`` (metadata and media) honours ``generation`` and the preconditions ``ifGenerationMatch`` /
  ``ifMetagenerationMatch`` (412 when they do not hold) and ``ifGenerationNotMatch`` / ``ifMetagenerationNotMatch``
  (304 Not Modified, no body, when they do not hold); https://cloud.google.com/storage/docs/json_api/v1/objects/get
  and https://cloud.google.com/storage/docs/request-preconditions. tensorstore re-reads a manifest with
  ``ifGenerationNotMatch=<the generation it holds>`` and expects 304 when it is unchanged.
- ``Range`` as RFC 9110 defines it, as GCS serves it: ``bytes=a-b``, ``bytes=a-`` and the suffix ``bytes=-n``
  (tensorstore sends all three), 416 when the first byte is past the end.
- ``objects.list`` honours ``startOffset`` (inclusive) / ``endOffset`` (exclusive), ``maxResults`` (items and
  prefixes together, at most 1000, the default), ``pageToken``/``nextPageToken`` and ``includeTrailingDelimiter``,
  and leaves out empty ``items``/``prefixes``; https://cloud.google.com/storage/docs/json_api/v1/objects/list.
  tensorstore lists a key range (and deletes one, DeleteRange) only through the offsets.

The emulator keeps one live generation per object and no noncurrent ones: a read of any other ``generation`` is
a 404, as Google answers for a generation that no longer exists. Soft-deleted reads stay the emulator's.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import BadRequest, NotFound
from gcp_storage_emulator.handlers import objects

Handler = Callable[..., Any]
PAGE_MAX = 1000  # Google's default and largest page of objects.list
_RANGE = re.compile(r"bytes=(?:(?P<first>\d+)-(?P<last>\d*)|-(?P<suffix>\d+))")


def _error(response: Any, status: HTTPStatus, reason: str, message: str) -> None:
    response.status = status
    error = {"domain": "global", "reason": reason, "message": message}
    response.json({"error": {"code": status.value, "message": message, "errors": [error]}})


def _param(request: Any, key: str) -> str | None:
    values = request.query.get(key)
    return str(values[0]) if values else None


def _truthy(request: Any, key: str) -> bool:
    return (_param(request, key) or "").lower() in ("1", "true", "yes")


class _Refused(Exception):
    """A read answered by its status alone: 304 (no body), 400, 404 or 412 (a JSON error)."""

    def __init__(self, status: HTTPStatus, reason: str = "", message: str = "") -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    def answer(self, response: Any) -> None:
        if self.status == HTTPStatus.NOT_MODIFIED:
            response.status = self.status
            return
        _error(response, self.status, self.reason, self.message)


_CONDITIONS = (  # (parameter, resource field, holds when equal, status when it does not hold)
    ("ifGenerationMatch", "generation", True, HTTPStatus.PRECONDITION_FAILED),
    ("ifMetagenerationMatch", "metageneration", True, HTTPStatus.PRECONDITION_FAILED),
    ("ifGenerationNotMatch", "generation", False, HTTPStatus.NOT_MODIFIED),
    ("ifMetagenerationNotMatch", "metageneration", False, HTTPStatus.NOT_MODIFIED),
)


def check_read(request: Any, obj: dict[str, Any]) -> None:
    """Raise _Refused unless the live object ``obj`` is the asked generation and every precondition holds
    (the 412s are checked before the 304s: a failed match is an error whatever else holds)."""
    wanted = _param(request, "generation")
    if wanted is not None and wanted != str(obj.get("generation")):
        raise _Refused(HTTPStatus.NOT_FOUND, "notFound", f"No such object: {obj.get('bucket')}/{obj.get('name')}")
    for key, field, equal, status in _CONDITIONS:
        value = _param(request, key)
        if value is None:
            continue
        if not value.lstrip("-").isdigit():
            raise _Refused(HTTPStatus.BAD_REQUEST, "invalid", f"Invalid value for {key}: {value}")
        if (int(value) == int(obj.get(field) or 0)) != equal:
            raise _Refused(status, "conditionNotMet", "At least one of the pre-conditions you specified did not hold.")


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive (first, last) bytes a ``Range`` header asks for; None for the whole object (no header,
    or one GCS ignores: another unit, several ranges). _Refused(416) when the first byte is past the end."""
    match = _RANGE.fullmatch((header or "").strip())
    if match is None or (size == 0 and match["suffix"] is not None):
        return None  # RFC 9110 14.1.1: of an empty object a suffix is the whole (empty) object
    if match["suffix"] is not None:
        if int(match["suffix"]) == 0:
            raise _Refused(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "invalid", "The requested range is empty.")
        return max(size - int(match["suffix"]), 0), size - 1
    first = int(match["first"])
    last = int(match["last"]) if match["last"] else size - 1
    if first >= size or last < first:
        raise _Refused(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "invalid", "The requested range is not satisfiable.")
    return first, min(last, size - 1)


def _send_media(request: Any, response: Any, data: bytes, obj: dict[str, Any]) -> None:
    """The object's bytes (or the asked range, 206) with the headers Google sends on a download."""
    size = len(data)
    span = _byte_range(request.get_header("range"), size)
    if span is None:
        response["x-goog-hash"] = f"crc32c={obj.get('crc32c')},md5={obj.get('md5Hash')}"
    else:
        response.status = HTTPStatus.PARTIAL_CONTENT
        response["Content-Range"] = f"bytes {span[0]}-{span[1]}/{size}"
        data = data[span[0] : span[1] + 1]
    response["x-goog-generation"] = str(obj.get("generation"))
    response["x-goog-metageneration"] = str(obj.get("metageneration"))
    response["x-goog-stored-content-length"] = str(size)
    response["x-goog-stored-content-encoding"] = obj.get("contentEncoding") or "identity"
    response["x-goog-storage-class"] = obj.get("storageClass") or "STANDARD"
    for key, value in (obj.get("metadata") or {}).items():
        if value is not None:
            response[f"x-goog-meta-{key}"] = str(value)  # custom metadata, as the emulator sent it
    if "response-content-disposition" in request.query:
        response["Content-Disposition"] = _param(request, "response-content-disposition")
    response.write_file(data, content_type=obj.get("contentType"))


def conditional_get(emulator_get: Handler, media_only: bool) -> Handler:
    """objects.get (``media_only``: the /download route) with generation, preconditions and download headers."""

    def handler(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        media = media_only or _param(request, "alt") == "media"
        if _truthy(request, "softDeleted") and not media:
            return emulator_get(request, response, storage, *args, **kwargs)
        bucket, name = request.params["bucket_name"], request.params["object_id"]
        try:
            obj = storage.get_file_obj(bucket, name)
            check_read(request, obj)
            if not media:
                return response.json(obj)
            _send_media(request, response, storage.get_file(bucket, name), obj)
        except NotFound:
            _error(response, HTTPStatus.NOT_FOUND, "notFound", f"No such object: {bucket}/{name}")
        except _Refused as refused:
            refused.answer(response)
        return None

    return handler


def _page_size(request: Any) -> int:
    raw = _param(request, "maxResults")
    if raw is None:
        return PAGE_MAX
    if not raw.isdigit() or int(raw) < 1:
        raise _Refused(HTTPStatus.BAD_REQUEST, "invalid", f"Invalid value for maxResults: {raw}")
    return min(int(raw), PAGE_MAX)


def _token(entry: tuple[str, int]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(entry)).encode()).decode()


def _after(request: Any) -> tuple[str, int] | None:
    raw = _param(request, "pageToken")
    if not raw:
        return None
    try:
        name, kind = json.loads(base64.urlsafe_b64decode(raw.encode()))
        return str(name), int(kind)
    except (ValueError, TypeError):
        raise _Refused(HTTPStatus.BAD_REQUEST, "invalid", "Invalid pageToken.") from None


def _entries(request: Any, storage: Any) -> list[tuple[str, int, Any]]:
    """Every entry of the listing, in Google's order: (name, 0, prefix) for a prefix, (name, 1, resource)."""
    prefix, delimiter, glob = _param(request, "prefix"), _param(request, "delimiter"), _param(request, "matchGlob")
    if glob is not None and delimiter not in (None, "/"):
        raise _Refused(HTTPStatus.BAD_REQUEST, "invalid", "With matchGlob the only delimiter is '/'.")
    start, end = _param(request, "startOffset") or "", _param(request, "endOffset")
    soft = _truthy(request, "softDeleted")
    flat, _ = storage.get_file_list(request.params["bucket_name"], prefix, None, glob, soft_deleted=soft)
    named = [(o["name"], o) for o in flat if o["name"] >= start and (end is None or o["name"] < end)]
    if not delimiter:
        return [(name, 1, o) for name, o in named]
    items, prefixes = storage._apply_list_delimiter(named, prefix, delimiter, glob)
    if _truthy(request, "includeTrailingDelimiter"):  # an object named like a prefix is listed as both
        items += [o for name, o in named if name in prefixes]
    return sorted([(p, 0, p) for p in prefixes] + [(o["name"], 1, o) for o in items], key=lambda e: e[:2])


def list_objects(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> None:
    """objects.list with offsets, pages and includeTrailingDelimiter; empty ``items``/``prefixes`` left out."""
    try:
        size, after = _page_size(request), _after(request)
        entries = [e for e in _entries(request, storage) if after is None or e[:2] > after]
    except _Refused as refused:
        return refused.answer(response)
    except NotFound:
        return _error(response, HTTPStatus.NOT_FOUND, "notFound", "The specified bucket does not exist.")
    except BadRequest as exc:
        return _error(response, HTTPStatus.BAD_REQUEST, "invalid", str(exc))
    page: dict[str, Any] = {"kind": "storage#objects"}
    shown = entries[:size]
    if prefixes := [value for _name, kind, value in shown if kind == 0]:
        page["prefixes"] = prefixes
    if items := [value for _name, kind, value in shown if kind == 1]:
        page["items"] = items
    if len(entries) > size:
        page["nextPageToken"] = _token((shown[-1][0], shown[-1][1]))
    return response.json(page)


def patch_reads() -> None:
    """Swap the emulator's get, download and list handlers (in its routing table) for the ones above."""
    swap = {
        objects.get: conditional_get(objects.get, media_only=False),
        objects.download: conditional_get(objects.download, media_only=True),
        objects.ls: list_objects,
    }
    for _pattern, methods in server.HANDLERS:
        for method, handler in list(methods.items()):
            if handler in swap:
                methods[method] = swap[handler]
