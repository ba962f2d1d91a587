"""Write options a request carries: `dryRun` and the DeleteOptions (body and query parameters both count).

`dryRun=All` is the only value the API server accepts
(https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run); a delete's `propagationPolicy`
(Foreground, Background, Orphan), the deprecated `orphanDependents` and `preconditions` as in
https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/delete-options/ and
https://kubernetes.io/docs/concepts/architecture/garbage-collection/#cascading-deletion (Background is
the default of every kind served here). Bad options are the 422 `Invalid` the API server answers for
`CreateOptions.meta.k8s.io` and friends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from interlude_localcloud.gke.status import KubeError

POLICIES = ("Foreground", "Background", "Orphan")


def _invalid(kind: str, path: str, message: str, reason: str = "FieldValueNotSupported") -> KubeError:
    cause = {"reason": reason, "field": path, "message": message}
    return KubeError(
        422,
        "Invalid",
        f'{kind}.meta.k8s.io "" is invalid: {path}: {message}',
        {"group": "meta.k8s.io", "kind": kind, "causes": [cause]},
    )


def _dry_run(values: list[str], kind: str) -> bool:
    bad = [v for v in values if v != "All"]
    if bad:
        shown = "[]string{" + ", ".join(json.dumps(v) for v in values) + "}"
        raise _invalid(kind, "dryRun", f'Unsupported value: {shown}: supported values: "All"')
    return bool(values)


def dry_run(request: Request, kind: str) -> bool:
    """Whether a create/update/patch is a dry run (`kind`: CreateOptions, UpdateOptions or PatchOptions)."""
    return _dry_run(request.query_params.getlist("dryRun"), kind)


@dataclass(frozen=True)
class DeleteOptions:
    propagation: str = "Background"
    dry_run: bool = False
    preconditions: dict[str, str] = field(default_factory=dict)


def delete_options(request: Request, body: Any) -> DeleteOptions:
    """The options of a DELETE: the body's DeleteOptions, then the query's parameters over them."""
    opts = dict(body) if isinstance(body, dict) else {}
    q = request.query_params
    if q.get("propagationPolicy"):
        opts["propagationPolicy"] = q["propagationPolicy"]
    if q.get("orphanDependents"):
        opts["orphanDependents"] = q["orphanDependents"].lower() in ("true", "1")
    if q.getlist("dryRun"):
        opts["dryRun"] = q.getlist("dryRun")
    policy = opts.get("propagationPolicy")
    orphan = opts.get("orphanDependents")
    if policy is not None and orphan is not None:
        raise _invalid(
            "DeleteOptions",
            "propagationPolicy",
            f'Invalid value: "{policy}": orphanDependents and deletionPropagation cannot be both set',
            "FieldValueInvalid",
        )
    if policy is not None and policy not in POLICIES:
        supported = ", ".join(f'"{p}"' for p in POLICIES)
        raise _invalid(
            "DeleteOptions", "propagationPolicy", f'Unsupported value: "{policy}": supported values: {supported}'
        )
    if policy is None:
        policy = "Orphan" if orphan else "Background"
    dry = opts.get("dryRun") or []
    pre = opts.get("preconditions") or {}
    return DeleteOptions(
        policy,
        _dry_run([str(v) for v in (dry if isinstance(dry, list) else [dry])], "DeleteOptions"),
        {k: str(v) for k, v in pre.items() if k in ("uid", "resourceVersion") and v} if isinstance(pre, dict) else {},
    )
