"""Errors the local cloud answers with, rendered in the shape each Google API family uses."""

from __future__ import annotations

from typing import Any

_STATUS_BY_CODE = {
    400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE",
}
_REASON_BY_CODE = {
    400: "invalid", 403: "forbidden", 404: "notFound", 409: "alreadyExists", 412: "conditionNotMet",
    429: "rateLimitExceeded", 500: "backendError", 503: "backendError",
}
# google.rpc.Code numbers, used inside long-running operation errors.
RPC_CODES = {"INVALID_ARGUMENT": 3, "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "RESOURCE_EXHAUSTED": 8,
             "FAILED_PRECONDITION": 9, "INTERNAL": 13, "UNAVAILABLE": 14}


class ApiError(Exception):
    """An HTTP error answer: status code, gRPC-style status name, message, optional Compute reason."""

    def __init__(self, code: int, message: str, status: str | None = None, reason: str | None = None,
                 details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or _STATUS_BY_CODE.get(code, "UNKNOWN")
        self.reason = reason or _REASON_BY_CODE.get(code, "unknown")
        self.details = details

    def body(self, family: str) -> dict[str, Any]:
        """`{"error": ...}` as TPU (google.rpc.Status style) or Compute (errors[] list) answers it."""
        if family == "compute":
            return {"error": {"code": self.code, "message": self.message,
                              "errors": [{"domain": "global", "reason": self.reason,
                                          "message": self.message}]}}
        err: dict[str, Any] = {"code": self.code, "message": self.message, "status": self.status}
        if self.details:
            err["details"] = self.details
        return {"error": err}


def not_found(what: str) -> ApiError:
    return ApiError(404, f"Resource '{what}' was not found", "NOT_FOUND", "notFound")


def already_exists(what: str) -> ApiError:
    return ApiError(409, f"The resource '{what}' already exists", "ALREADY_EXISTS", "alreadyExists")


def invalid(message: str) -> ApiError:
    return ApiError(400, message, "INVALID_ARGUMENT", "invalid")
