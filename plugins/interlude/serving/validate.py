"""Validate rendered manifests before anything is applied: core kinds against Kubernetes' own OpenAPI
schemas (kubernetes-validate, strict: unknown fields refused) for the pinned Kubernetes version, the
ComputeClass and PodMonitoring custom resources against the JSON schemas in include/schemas/ (written
from GKE's and Managed Prometheus' public references). Pure: reads only schema files.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

KUBERNETES_VERSION = "1.33.0"
"""GKE's regular channel minor Interlude targets (https://cloud.google.com/kubernetes-engine/docs/release-notes)."""
SCHEMA_DIR = Path(__file__).resolve().parents[3] / "include" / "schemas"
CUSTOM_SCHEMAS = {
    ("cloud.google.com/v1", "ComputeClass"): "computeclass.schema.json",
    ("monitoring.googleapis.com/v1", "PodMonitoring"): "podmonitoring.schema.json",
}


@functools.lru_cache(maxsize=8)
def _validator(filename: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMA_DIR / filename).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def problems(obj: dict[str, Any], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    """Every schema violation of one object ([] when valid), each prefixed with kind/name."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CUSTOM_SCHEMAS:
        errors = sorted(_validator(CUSTOM_SCHEMAS[key]).iter_errors(obj), key=lambda e: list(e.absolute_path))
        return [f"{_where(obj)}: {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors]
    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = "/".join(map(str, exc.absolute_path)) or "(root)"
        return [f"{_where(obj)}: {path}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [f"{_where(obj)}: no schema for {key[0]} {key[1]} in Kubernetes {kubernetes_version} ({exc!r})"]
    return []


def validate_all(objects: Iterable[dict[str, Any]], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    return [p for obj in objects for p in problems(obj, kubernetes_version)]
