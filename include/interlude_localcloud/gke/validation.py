"""Admission: every object is checked before it is stored, as the API server checks it.

Core kinds are checked against the OpenAPI-derived JSON schemas of the cluster's Kubernetes minor
version (kubernetes-validate's strict schemas), plus the semantic checks the API server adds that a
schema cannot say (names, a Deployment's selector matching its template, container images). The
ComputeClass CRD is checked against computeclass.schema.json. A violation becomes the 422
`reason: Invalid` Status with `details.causes` that the real API server answers.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate.utils as kv
from referencing import Registry, Resource

from interlude_localcloud.gke import job_api, status
from interlude_localcloud.gke.resources import ResourceType

COMPUTECLASS_SCHEMA = Path(__file__).with_name("computeclass.schema.json")
#: Custom resources (CRDs) and the JSON schema each is admitted by; core kinds use kubernetes-validate's.
CUSTOM_SCHEMAS = {
    "ComputeClass": COMPUTECLASS_SCHEMA,
    "PodMonitoring": Path(__file__).with_name("podmonitoring.schema.json"),
    "JobSet": Path(__file__).with_name("jobset.schema.json"),
}
#: Custom resources whose CRD is structural: undeclared fields are pruned (with a Warning), not refused.
PRUNED_CUSTOM = {"JobSet"}
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAMES = {"namespaces", "services"}  # these names must be DNS-1123 labels, others subdomains


@functools.cache
def _schema_version(minor: str) -> str:
    """The newest schema set not newer than the cluster's minor version."""
    return [v for v in kv.all_versions() if kv.major_minor(v) <= minor][-1]


@functools.cache
def _core_validator(minor: str, kind: str, api_version: str) -> jsonschema.protocols.Validator:
    version = _schema_version(minor)
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    schema_dir = f"kubernetes-json-schema/v{version}-local-strict"
    schema = kv.schema_contents(f"{schema_dir}/{kind.lower()}-{group_version}.json", minor)
    defs = kv.schema_contents(f"{schema_dir}/_definitions.json", minor)
    registry: Registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def _custom_validator(kind: str) -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(json.loads(CUSTOM_SCHEMAS[kind].read_text()))


def _field(path: Iterable[Any]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _cause(e: jsonschema.ValidationError) -> list[dict[str, str]]:
    field = _field(e.absolute_path)
    if e.validator == "required":
        missing = [p for p in e.validator_value if p not in (e.instance or {})]
        return [
            {"reason": "FieldValueRequired", "message": "Required value", "field": f"{field}.{m}" if field else m}
            for m in missing
        ]
    if e.validator == "additionalProperties":
        known = set(e.schema.get("properties") or {})
        extra = sorted(set(e.instance) - known)
        return [
            {
                "reason": "FieldValueInvalid",
                "message": f'Invalid value: "{x}": field not declared in schema',
                "field": f"{field}.{x}" if field else x,
            }
            for x in extra
        ]
    if e.validator in ("enum", "const"):
        allowed = e.validator_value if e.validator == "enum" else [e.validator_value]
        return [
            {
                "reason": "FieldValueNotSupported",
                "field": field,
                "message": f"Unsupported value: {json.dumps(e.instance)}: supported values: "
                + ", ".join(json.dumps(a) for a in allowed),
            }
        ]
    if e.validator == "type":
        return [
            {
                "reason": "FieldValueTypeInvalid",
                "field": field,
                "message": f"Invalid value: {json.dumps(e.instance)[:80]}: must be of type {e.validator_value}",
            }
        ]
    return [{"reason": "FieldValueInvalid", "field": field, "message": f"Invalid value: {e.message}"}]


def _prune_unknown(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[str]:
    """Drop fields the schema does not declare (the API server's default `fieldValidation=Warn`)."""
    dropped: list[str] = []
    for _ in range(50):
        errs = [e for e in validator.iter_errors(obj) if e.validator == "additionalProperties"]
        if not errs:
            break
        for e in errs:
            known = set(e.schema.get("properties") or {})
            for extra in sorted(set(e.instance) - known):
                e.instance.pop(extra, None)
                base = _field(e.absolute_path)
                dropped.append(f"{base}.{extra}" if base else extra)
    return dropped


class Admission:
    """Validates objects for one cluster (its Kubernetes minor version)."""

    def __init__(self, minor: str) -> None:
        self.minor = minor
        _schema_version(minor)  # fail at start, not at the first request, for an unsupported version

    def _validator(self, rt: ResourceType) -> jsonschema.protocols.Validator:
        if rt.kind in CUSTOM_SCHEMAS:
            return _custom_validator(rt.kind)
        return _core_validator(self.minor, rt.kind, rt.api_version)

    def prune(self, rt: ResourceType, obj: dict[str, Any]) -> list[str]:
        """Remove undeclared fields of a core object; return their paths (for `Warning` headers)."""
        if rt.kind in CUSTOM_SCHEMAS and rt.kind not in PRUNED_CUSTOM:
            return []
        return _prune_unknown(self._validator(rt), obj)

    def unknown_fields(self, rt: ResourceType, obj: dict[str, Any]) -> list[str]:
        return [
            c["field"]
            for e in self._validator(rt).iter_errors(obj)
            if e.validator == "additionalProperties"
            for c in _cause(e)
        ]

    def __call__(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if rt.kind == "Job":
            job_api.generate_selector(obj)  # the Job strategy's Validate does it, once the uid is assigned
        causes = [
            c
            for e in sorted(self._validator(rt).iter_errors(obj), key=lambda e: list(e.absolute_path))
            for c in _cause(e)
        ]
        causes += semantic_causes(rt, obj)
        if causes:
            raise status.invalid(rt, (obj.get("metadata") or {}).get("name") or "", causes)

    def check_update(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> None:
        """An update's own rules (immutable fields), after the new object passed `__call__`."""
        causes = update_causes(rt, old, new)
        if causes:
            raise status.invalid(rt, (new.get("metadata") or {}).get("name") or "", causes)


def _name_causes(rt: ResourceType, meta: dict[str, Any]) -> list[dict[str, str]]:
    name = meta.get("name") or ""
    if not name:
        return [
            {
                "reason": "FieldValueRequired",
                "message": "Required value: name or generateName is required",
                "field": "metadata.name",
            }
        ]
    pattern = _DNS1123_LABEL if rt.plural in _LABEL_NAMES else _DNS1123_SUBDOMAIN
    limit = 63 if rt.plural in _LABEL_NAMES else 253
    if not pattern.match(name) or len(name) > limit:
        return [
            {
                "reason": "FieldValueInvalid",
                "field": "metadata.name",
                "message": f'Invalid value: "{name}": a lowercase RFC 1123 name must consist of lower case '
                "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric "
                "character",
            }
        ]
    return []


def _container_causes(pod_spec: dict[str, Any], base: str) -> list[dict[str, str]]:
    """Images required; container names unique within a pod (regular ones, then init ones against all).

    The API server's pod validation answers a repeated name as `Duplicate value` at the later entry's
    `...containers[i].name` (https://kubernetes.io/docs/concepts/workloads/pods/#pod-templates: a template
    is validated as the pod it makes).
    """
    out = []
    names: set[str] = set()
    for key in ("containers", "initContainers"):
        for i, c in enumerate(pod_spec.get(key) or []):
            if not isinstance(c, dict):
                continue
            if key == "containers" and not c.get("image"):
                out.append(
                    {"reason": "FieldValueRequired", "message": "Required value", "field": f"{base}.{key}[{i}].image"}
                )
            name = c.get("name")
            if isinstance(name, str) and name in names:
                out.append(
                    {
                        "reason": "FieldValueDuplicate",
                        "message": f"Duplicate value: {json.dumps(name)}",
                        "field": f"{base}.{key}[{i}].name",
                    }
                )
            names.add(str(name))
    return out


def pod_specs(kind: str, spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The pod specs an object carries, with their field paths: a Pod's own, a workload's template(s)."""
    if kind == "Pod":
        return [("spec", spec)]
    if kind in ("Deployment", "Job", "ReplicaSet", "StatefulSet", "DaemonSet"):
        inner = (spec.get("template") or {}).get("spec")
        return [("spec.template.spec", inner)] if isinstance(inner, dict) else []
    if kind == "JobSet":  # jobset.x-k8s.io: each replicated Job's pod template
        out = []
        for i, rj in enumerate(spec.get("replicatedJobs") or []):
            inner = ((((rj or {}).get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")
            if isinstance(inner, dict):
                out.append((f"spec.replicatedJobs[{i}].template.spec.template.spec", inner))
        return out
    return []


#: Fields fixed at creation: (kind, path). apps/v1 made a Deployment's selector immutable
#: (https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#label-selector-updates).
IMMUTABLE = {"Deployment": (("spec", "selector"),), "Job": (("spec", "selector"),)}


def _go_selector(sel: Any) -> str:
    """How the API server prints a LabelSelector in an immutability message (Go's %#v)."""
    sel = sel or {}
    labels = ", ".join(f'"{k}":"{v}"' for k, v in sorted((sel.get("matchLabels") or {}).items()))
    return (
        f"v1.LabelSelector{{MatchLabels:map[string]string{{{labels}}}, "
        "MatchExpressions:[]v1.LabelSelectorRequirement(nil)}"
    )


def update_causes(rt: ResourceType, old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, str]]:
    """Rules an update must keep beyond the object's own validity: immutable fields stay as created."""
    out = []
    for path in IMMUTABLE.get(rt.kind, ()):
        before: Any = old
        after: Any = new
        for key in path:
            before = (before or {}).get(key) if isinstance(before, dict) else None
            after = (after or {}).get(key) if isinstance(after, dict) else None
        if before != after:
            shown = _go_selector(after) if path[-1] == "selector" else json.dumps(after)
            out.append(
                {
                    "reason": "FieldValueInvalid",
                    "message": f"Invalid value: {shown}: field is immutable",
                    "field": ".".join(path),
                }
            )
    return out


def _deployment_causes(spec: dict[str, Any]) -> list[dict[str, str]]:
    selector = spec.get("selector") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    out: list[dict[str, str]] = []
    match = selector.get("matchLabels") or {}
    if not match and not selector.get("matchExpressions"):
        out.append(
            {
                "reason": "FieldValueInvalid",
                "field": "spec.selector",
                "message": "Invalid value: v1.LabelSelector{}: empty selector is invalid for deployment",
            }
        )
    elif any(labels.get(k) != v for k, v in match.items()):
        out.append(
            {
                "reason": "FieldValueInvalid",
                "field": "spec.template.metadata.labels",
                "message": f"Invalid value: {json.dumps(labels)}: `selector` does not match template `labels`",
            }
        )
    if int(spec.get("replicas", 1) or 0) < 0:
        out.append(
            {
                "reason": "FieldValueInvalid",
                "field": "spec.replicas",
                "message": "Invalid value: must be greater than or equal to 0",
            }
        )
    return out


def semantic_causes(rt: ResourceType, obj: dict[str, Any]) -> list[dict[str, str]]:
    causes = _name_causes(rt, obj.get("metadata") or {})
    spec = obj.get("spec") or {}
    if not isinstance(spec, dict):
        return causes
    if rt.kind == "Deployment":
        causes += _deployment_causes(spec)
    if rt.kind == "Job":
        causes += job_api.job_causes(spec)
    for base, pod_spec in pod_specs(rt.kind, spec):
        causes += _container_causes(pod_spec, base)
    return causes
