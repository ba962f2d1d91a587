"""`Status` objects as the Kubernetes API server answers errors (`kind: Status`, reason, code, details).

Shapes follow https://kubernetes.io/docs/reference/using-api/api-concepts/ and the apimachinery
StatusReason values (NotFound 404, AlreadyExists 409, Conflict 409, Invalid 422, BadRequest 400,
Unauthorized 401, Gone 410, MethodNotAllowed 405).
"""

from __future__ import annotations

from typing import Any

from interlude_localcloud.gke.resources import ResourceType


class KubeError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out


def _details(rt: ResourceType, name: str) -> dict[str, Any]:
    d: dict[str, Any] = {"name": name, "kind": rt.plural}
    if rt.group:
        d["group"] = rt.group
    return d


def not_found(rt: ResourceType, name: str) -> KubeError:
    return KubeError(404, "NotFound", f'{rt.qualified} "{name}" not found', _details(rt, name))


def already_exists(rt: ResourceType, name: str) -> KubeError:
    return KubeError(409, "AlreadyExists", f'{rt.qualified} "{name}" already exists', _details(rt, name))


def conflict(rt: ResourceType, name: str, why: str) -> KubeError:
    return KubeError(
        409, "Conflict", f'Operation cannot be fulfilled on {rt.qualified} "{name}": {why}', _details(rt, name)
    )


def invalid(rt: ResourceType, name: str, causes: list[dict[str, str]]) -> KubeError:
    """422 with `details.causes` [{reason, message, field}] as the API server's field validation answers."""
    summary = ", ".join(f"{c['field']}: {c['message']}" if c.get("field") else c["message"] for c in causes)
    if len(causes) > 1:
        summary = f"[{summary}]"
    details = {"name": name, "kind": rt.kind, "causes": causes}
    if rt.group:
        details["group"] = rt.group
    return KubeError(422, "Invalid", f'{rt.group_kind} "{name}" is invalid: {summary}', details)


def bad_request(message: str) -> KubeError:
    return KubeError(400, "BadRequest", message)


def gone(message: str) -> KubeError:
    return KubeError(410, "Expired", message)


def success(rt: ResourceType, name: str, uid: str) -> dict[str, Any]:
    details = {**_details(rt, name), "uid": uid}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}
