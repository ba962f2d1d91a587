"""gcp-storage-emulator with GCS's write preconditions: ``python -m interlude_localcloud.gcs_emulator start ...``.

The emulator ignores ``ifGenerationMatch`` on object inserts and deletes; Google honours it and answers
412 conditionNotMet (https://cloud.google.com/storage/docs/request-preconditions). Interlude relies on it
(``ifGenerationMatch=0``: create only if absent, for machine slots), so the local GCS must too: the
emulator's own insert and delete handlers are wrapped with the check, under one lock so that check and
write are atomic as they are on Google. Everything else is the emulator's, unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gcp_storage_emulator import __main__ as emulator_main
from gcp_storage_emulator import server
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

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


if __name__ == "__main__":
    patch_handlers()
    emulator_main.main()
