"""Clear exceptions for what Google's TPU and Compute APIs answer, and the mapping that produces them.

Callers (capacity probing, operators, triggers) decide by exception class: a ``StockoutError`` means
"try another zone or type", a ``QuotaExceededError`` means "this project cannot have more", a
``TransientError`` means "the API kept answering 429/503 and our bounded retries gave up". Google signals
these in several shapes (HTTP error bodies, TPU long-running operation ``error`` statuses, Compute
``Operation.error.errors[]`` codes); every shape is turned into the same classes here, keeping Google's
own message so a human reading a task log sees what Google said.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "CloudError",
    "NotFoundError",
    "AlreadyExistsError",
    "StockoutError",
    "QuotaExceededError",
    "InvalidRequestError",
    "TransientError",
    "error_from_http",
    "error_from_rpc_status",
    "error_from_compute_operation",
    "error_from_api_core",
    "RETRYABLE_HTTP_CODES",
]

#: HTTP answers worth retrying: rate limited (429) and temporarily unavailable (502/503/504).
RETRYABLE_HTTP_CODES = frozenset({429, 502, 503, 504})


class CloudError(Exception):
    """An error answered by a Google Cloud API (or the local cloud that imitates it).

    ``code`` is the HTTP status (for long-running operation errors: the HTTP equivalent of the gRPC
    code), ``status`` the canonical name (``NOT_FOUND``, ``RESOURCE_EXHAUSTED``, ...) or the Compute
    error code (``ZONE_RESOURCE_POOL_EXHAUSTED``), ``message`` Google's message, ``details`` the raw
    error payload for anyone who needs more.
    """

    def __init__(self, message: str, code: int | None = None, status: str | None = None, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the attributes when pickled (Airflow and multiprocessing pickle exceptions).
        return (type(self), (self.message, self.code, self.status, self.details))

    def __str__(self) -> str:
        prefix = " ".join(str(p) for p in (self.code, self.status) if p not in (None, ""))
        return f"{prefix}: {self.message}" if prefix else self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"


class NotFoundError(CloudError):
    """The resource does not exist (HTTP 404)."""


class AlreadyExistsError(CloudError):
    """A create named a resource that already exists (HTTP 409)."""


class StockoutError(CloudError):
    """The zone has no capacity for the requested machine/accelerator type right now."""


class QuotaExceededError(CloudError):
    """The project's quota does not allow the request."""


class InvalidRequestError(CloudError):
    """The request was malformed or names an unknown type/version (HTTP 400)."""


class TransientError(CloudError):
    """The API kept answering 429/503 (or the connection kept failing) until our retries gave up."""


# gRPC canonical code -> (HTTP status, canonical name); see google/rpc/code.proto.
_GRPC_CODES: dict[int, tuple[int, str]] = {
    0: (200, "OK"),
    1: (499, "CANCELLED"),
    2: (500, "UNKNOWN"),
    3: (400, "INVALID_ARGUMENT"),
    4: (504, "DEADLINE_EXCEEDED"),
    5: (404, "NOT_FOUND"),
    6: (409, "ALREADY_EXISTS"),
    7: (403, "PERMISSION_DENIED"),
    8: (429, "RESOURCE_EXHAUSTED"),
    9: (400, "FAILED_PRECONDITION"),
    10: (409, "ABORTED"),
    11: (400, "OUT_OF_RANGE"),
    12: (501, "UNIMPLEMENTED"),
    13: (500, "INTERNAL"),
    14: (503, "UNAVAILABLE"),
    15: (500, "DATA_LOSS"),
    16: (401, "UNAUTHENTICATED"),
}

_QUOTA_RE = re.compile(r"\bquota\b.*\bexceeded\b|\bexceeded\b.*\bquota\b", re.IGNORECASE | re.DOTALL)
_STOCKOUT_MARKERS = (
    "no more capacity",
    "does not have enough resources available",
    "insufficient capacity",
    "resource_pool_exhausted",
    "stockout",
)
_STOCKOUT_CODES = ("ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "STOCKOUT")
# Resource quota (not request-rate limits, which come as 429 ``rateLimitExceeded`` and are transient).
_QUOTA_REASONS = ("quotaExceeded", "QUOTA_EXCEEDED")


def _looks_like_quota(message: str) -> bool:
    return bool(_QUOTA_RE.search(message)) or message.lower().startswith("quota limit")


def _looks_like_stockout(message: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in _STOCKOUT_MARKERS)


def _reasons(error: dict[str, Any]) -> list[str]:
    """All machine-readable reasons in a Google error body (``errors[].reason`` and ErrorInfo details)."""
    reasons: list[str] = []
    for item in error.get("errors") or []:
        if isinstance(item, dict):
            reasons.extend(str(item[k]) for k in ("reason", "code") if item.get(k))
    for detail in error.get("details") or []:
        if isinstance(detail, dict) and detail.get("reason"):
            reasons.append(str(detail["reason"]))
    return reasons


def error_from_http(status_code: int, payload: Any) -> CloudError:
    """Map an HTTP error answer (status + decoded body) to the matching exception class.

    ``payload`` is the decoded JSON body (``{"error": {...}}``) or its text when it was not JSON.
    """
    error: dict[str, Any] = {}
    if isinstance(payload, dict):
        raw = payload.get("error", payload)
        error = raw if isinstance(raw, dict) else {"message": str(raw)}
    elif payload:
        error = {"message": str(payload)}
    message = str(error.get("message") or f"HTTP {status_code}")
    status = str(error.get("status") or "") or None
    reasons = _reasons(error)
    args = (message, status_code, status, error or payload)

    if any(r in _STOCKOUT_CODES for r in reasons) or _looks_like_stockout(message):
        return StockoutError(message, status_code, status or next(iter(reasons), None), error)
    if status_code != 429 and (
        any(r in _QUOTA_REASONS for r in reasons) or (status_code == 403 and _looks_like_quota(message))
    ):
        return QuotaExceededError(*args)
    if status_code in RETRYABLE_HTTP_CODES:
        return TransientError(*args)
    if status_code == 404:
        return NotFoundError(*args)
    if status_code == 409:
        return AlreadyExistsError(*args)
    if status_code == 400:
        return InvalidRequestError(*args)
    return CloudError(*args)


def error_from_rpc_status(error: dict[str, Any]) -> CloudError:
    """Map a ``google.rpc.Status`` (a TPU long-running operation's ``error``) to an exception.

    Google ends a TPU create beyond capacity or beyond quota with code 8 (RESOURCE_EXHAUSTED); only the
    message tells them apart ("Quota limit '...' has been exceeded" vs "There is no more capacity in
    the zone ..."). A RESOURCE_EXHAUSTED that names no quota is treated as a stockout: it is the zone
    that ran out, and the caller's useful reaction (another zone or type) is the same.
    """
    grpc_code = int(error.get("code") or 2)
    http_code, status = _GRPC_CODES.get(grpc_code, (500, "UNKNOWN"))
    message = str(error.get("message") or status)
    args = (message, http_code, status, error)
    if grpc_code == 8 or _looks_like_stockout(message):
        if _looks_like_quota(message):
            return QuotaExceededError(*args)
        return StockoutError(*args)
    if grpc_code == 5:
        return NotFoundError(*args)
    if grpc_code == 6:
        return AlreadyExistsError(*args)
    if grpc_code in (3, 9, 11):
        return InvalidRequestError(*args)
    if grpc_code == 14:
        return TransientError(*args)
    return CloudError(*args)


def error_from_compute_operation(operation: dict[str, Any]) -> CloudError:
    """Map a finished Compute ``Operation`` with ``error.errors[]`` to an exception.

    A stockout is ``errors[0].code == "ZONE_RESOURCE_POOL_EXHAUSTED"`` on an operation that is DONE.
    """
    errors = [e for e in (operation.get("error") or {}).get("errors") or [] if isinstance(e, dict)]
    first = errors[0] if errors else {}
    code = str(first.get("code") or "UNKNOWN")
    message = "; ".join(str(e.get("message") or e.get("code")) for e in errors) or code
    http_code = operation.get("httpErrorStatusCode")
    http_code = int(http_code) if http_code else None
    args = (message, http_code, code, operation.get("error"))
    codes = [str(e.get("code")) for e in errors]
    if any(c in _STOCKOUT_CODES for c in codes) or _looks_like_stockout(message):
        return StockoutError(*args)
    if any(c in _QUOTA_REASONS for c in codes) or _looks_like_quota(message):
        return QuotaExceededError(*args)
    if code in ("RESOURCE_NOT_FOUND", "NOT_FOUND") or http_code == 404:
        return NotFoundError(*args)
    if code in ("RESOURCE_ALREADY_EXISTS", "ALREADY_EXISTS") or http_code == 409:
        return AlreadyExistsError(*args)
    if http_code in RETRYABLE_HTTP_CODES:
        return TransientError(*args)
    if code.startswith("INVALID") or http_code == 400:
        return InvalidRequestError(*args)
    return CloudError(*args)


def error_from_api_core(exc: Exception) -> CloudError:
    """Map a ``google.api_core.exceptions.GoogleAPICallError`` raised by a google-cloud-* client.

    REST clients keep the HTTP response on the exception; its body is parsed exactly like our own
    REST calls so both paths give the same classes and messages.
    """
    response = getattr(exc, "response", None)
    status_code = getattr(response, "status_code", None)
    if isinstance(status_code, int):
        try:
            payload: Any = response.json()  # type: ignore[union-attr]
        except ValueError:
            payload = getattr(response, "text", "") or str(exc)
        return error_from_http(status_code, payload)
    code = getattr(exc, "code", None)
    http_code = code if isinstance(code, int) else None
    body: dict[str, Any] = {
        "message": getattr(exc, "message", None) or str(exc),
        "errors": list(getattr(exc, "errors", None) or []),
    }
    return error_from_http(http_code or 500, {"error": body})
