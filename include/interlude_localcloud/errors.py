"""Errors the local cloud answers with, rendered in the shape each Google API family uses."""

from __future__ import annotations

import zlib
from typing import Any

_STATUS_BY_CODE = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
}
_REASON_BY_CODE = {
    400: "invalid",
    403: "forbidden",
    404: "notFound",
    409: "alreadyExists",
    412: "conditionNotMet",
    429: "rateLimitExceeded",
    500: "backendError",
    503: "backendError",
}
# google.rpc.Code numbers, used inside long-running operation errors.
RPC_CODES = {
    "INVALID_ARGUMENT": 3,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
}


class ApiError(Exception):
    """An HTTP error answer: status code, gRPC-style status name, message, optional Compute reason."""

    def __init__(
        self,
        code: int,
        message: str,
        status: str | None = None,
        reason: str | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or _STATUS_BY_CODE.get(code, "UNKNOWN")
        self.reason = reason or _REASON_BY_CODE.get(code, "unknown")
        self.details = details

    def body(self, family: str) -> dict[str, Any]:
        """`{"error": ...}` as TPU (google.rpc.Status style) or Compute (errors[] list) answers it."""
        if family == "compute":
            domain = "usageLimits" if self.code == 429 else "global"
            compute: dict[str, Any] = {
                "code": self.code,
                "message": self.message,
                "errors": [{"domain": domain, "reason": self.reason, "message": self.message}],
            }
            if self.details:
                compute.update(status=self.status, details=self.details)
            elif self.code == 501:  # a method the local cloud lacks: the status says so (not "no such resource")
                compute["status"] = self.status
            return {"error": compute}
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


def _service(path: str) -> str:
    if path.startswith("/compute/"):
        return "compute.googleapis.com"
    if path.startswith("/storage/") or path.startswith("/upload/storage/"):
        return "storage.googleapis.com"
    return "tpu.googleapis.com"


def rate_limited(method: str, path: str, project: str) -> ApiError:
    """429 as Google words it: a per-minute request quota of the service, for the project's number, with a
    google.rpc.ErrorInfo (RATE_LIMIT_EXCEEDED) detail. Distinct from resource quota (403 quotaExceeded)."""
    service = _service(path)
    kind = "Read" if method.upper() == "GET" else "Write"
    metric, limit = f"{kind} requests", f"{kind} requests per minute"
    consumer = f"project_number:{zlib.crc32(project.encode()) % 10**12:012d}"
    message = (
        f"Quota exceeded for quota metric '{metric}' and limit '{limit}' of service '{service}' "
        f"for consumer '{consumer}'."
    )
    details = [
        {
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": "RATE_LIMIT_EXCEEDED",
            "domain": "googleapis.com",
            "metadata": {
                "service": service,
                "consumer": consumer,
                "quota_metric": f"{service}/{kind.lower()}_requests",
                "quota_limit": f"{kind}RequestsPerMinutePerProject",
            },
        },
        {
            "@type": "type.googleapis.com/google.rpc.Help",
            "links": [
                {
                    "description": "Request a higher quota limit.",
                    "url": "https://cloud.google.com/docs/quotas/help/request_increase",
                }
            ],
        },
    ]
    return ApiError(429, message, "RESOURCE_EXHAUSTED", "rateLimitExceeded", details)


def injected_fault(status: int, method: str, path: str, project: str) -> ApiError:
    """The answer to a fault the scenario or a test injected, in Google's words for that status."""
    if status == 429:
        return rate_limited(method, path, project)
    return ApiError(
        status,
        "The service is currently unavailable."
        if status == 503
        else "Injected fault: the service is temporarily unavailable.",
    )
