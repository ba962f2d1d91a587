"""Names, labels and annotations every serving object carries.

Labels carry the first 16 hex digits of the ServeSpec digest (label values are at most 63 characters);
annotations carry the whole digest and the checkpoint URI (which labels cannot hold), so `kubectl get -o
yaml` on any object says which spec and checkpoint made it.
"""

from __future__ import annotations

from typing import Any

from interlude.serving.spec import ServeSpec

ANNOTATION_CHECKPOINT = "interlude_dev.wiring/checkpoint-uri"
ANNOTATION_DIGEST = "interlude_dev.wiring/spec-digest"
MANAGED_BY = "interlude"

Manifest = dict[str, Any]


def selector_labels(spec: ServeSpec) -> dict[str, str]:
    return {"app.kubernetes.io/name": spec.name}


def labels(spec: ServeSpec) -> dict[str, str]:
    return {
        **selector_labels(spec),
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "interlude_dev.wiring/spec-digest": spec.digest()[:16],
    }


def annotations_for(spec: ServeSpec) -> dict[str, str]:
    out = {ANNOTATION_DIGEST: spec.digest()}
    if spec.checkpoint_uri is not None:
        out[ANNOTATION_CHECKPOINT] = spec.checkpoint_uri
    return out


def metadata(spec: ServeSpec, name: str, *, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels(spec), "annotations": annotations_for(spec)}
    if namespaced:
        meta["namespace"] = spec.namespace
    return meta
