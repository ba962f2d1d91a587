"""Validate rendered manifests before anything is applied: core kinds against Kubernetes' own OpenAPI
schemas (kubernetes-validate, strict: unknown fields refused) for the pinned Kubernetes version, the
ComputeClass and PodMonitoring custom resources against the JSON schemas in plugins/interlude/serving/schemas/ (written
from GKE's and Managed Prometheus' public references). Pure: reads only schema files.

A CRD carries two kinds of rules: its structural schema (types, enums, ranges, unknown fields), which
jsonschema checks, and its `x-kubernetes-validations` CEL rules (machineType vs machineFamily, Flex Start
vs Spot, priorityScore all-or-none, ...), which the API server evaluates and JSON Schema cannot. The
schema file keeps each CEL rule where the CRD puts it; CEL_CHECKS below holds one pure Python predicate
per rule message, and `_cel_problems` walks the object beside the schema so each predicate runs exactly
where the API server would run the rule. A rule in the schema without a predicate is refused (fail
closed), so a newer CRD copied in cannot be silently half-enforced.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

import jsonschema
import kubernetes_validate

KUBERNETES_VERSION = "1.33.0"
"""GKE's regular channel minor Interlude targets (https://cloud.google.com/kubernetes-engine/docs/release-notes)."""
SCHEMA_DIR = Path(str(resources.files("interlude.serving") / "schemas"))  # package data
CUSTOM_SCHEMAS = {
    ("cloud.google.com/v1", "ComputeClass"): "computeclass.schema.json",
    ("monitoring.googleapis.com/v1", "PodMonitoring"): "podmonitoring.schema.json",
}
Node = Mapping[str, Any]


class CelCheck(NamedTuple):
    """One CRD CEL rule: the fields it is about (named in every refusal) and `ok(self)`, True when it holds."""

    fields: str
    ok: Callable[[Any], bool]


# --------------------------------------------------------------- the CRD's CEL rules, as pure predicates
# Source: the x-kubernetes-validations of computeclasses.cloud.google.com
# (plugins/interlude/serving/schemas/computeclass.schema.json
# names the CRD copy and Google's reference pages). `has(x)` is "key present"; defaults the API server applies
# before CEL runs (priorities: [], enabled: false) are applied here with .get(..., default).
def _autopilot(spec: Node) -> bool:
    return bool(spec.get("autopilot", {}).get("enabled", False))


def _rules(spec: Node) -> list[Node]:
    return list(spec.get("priorities", []))


def _pool_config(spec: Node) -> Node:
    config: Node = spec.get("nodePoolConfig", {})
    return config


def _confidential(spec: Node, kind: str) -> bool:
    return _pool_config(spec).get("confidentialNodeType") == kind


def _family_in(rule: Node, families: tuple[str, ...]) -> bool:
    """CEL: (has(machineFamily) && machineFamily in F) || (has(machineType) && machineType.split('-')[0] in F)."""
    return rule.get("machineFamily") in families or (
        "machineType" in rule and rule["machineType"].split("-")[0] in families
    )


def _tdx_machine(rule: Node) -> bool:
    machine = rule.get("machineType", "")
    return rule.get("machineFamily") in ("c3", "c4", "a3", "a4") or (
        "machineType" in rule
        and (machine.startswith(("c3-standard-", "c4-standard-")) or machine in ("a3-highgpu-1g", "a4-highgpu-8g"))
    )


def _tdx_gpu(family: str, machine: Callable[[str], bool], gpu_type: str) -> Callable[[Node], bool]:
    """TDX on one family allows only its machine types and one GPU type (a GPU without a type is allowed)."""

    def ok(spec: Node) -> bool:
        if not _confidential(spec, "TDX"):
            return True
        on_family = [r for r in _rules(spec) if r.get("machineFamily") == family or machine(r.get("machineType", ""))]
        return all(r.get("gpu", {}).get("type", gpu_type) == gpu_type for r in on_family)

    return ok


def _flex_start(rule: Node) -> bool:
    return bool(rule.get("flexStart", {}).get("enabled", False))


def _both(node: Node, a: str, b: str) -> bool:
    return a in node and b in node


CEL_CHECKS: dict[str, CelCheck] = {
    # spec
    "Nodepools priority cannot be used when Autopilot is enabled": CelCheck(
        "autopilot, priorities[].nodepools", lambda s: not _autopilot(s) or not any("nodepools" in r for r in _rules(s))
    ),
    "NodePoolAutoCreation cannot be disabled when Autopilot is enabled": CelCheck(
        "autopilot, nodePoolAutoCreation.enabled",
        lambda s: (
            not _autopilot(s) or "nodePoolAutoCreation" not in s or s["nodePoolAutoCreation"].get("enabled", False)
        ),
    ),
    "Only cos_containerd image type can be used when Autopilot is enabled": CelCheck(
        "autopilot, nodePoolConfig.imageType",
        lambda s: not _autopilot(s) or _pool_config(s).get("imageType", "cos_containerd") == "cos_containerd",
    ),
    "Only DEFAULT logging variant can be used when Autopilot is enabled": CelCheck(
        "autopilot, nodePoolConfig.loggingConfig.loggingVariantConfig.variant",
        lambda s: (
            not _autopilot(s)
            or _pool_config(s).get("loggingConfig", {}).get("loggingVariantConfig", {}).get("variant", "DEFAULT")
            == "DEFAULT"
        ),
    ),
    "If NodePoolGroup is not specified NodePoolConfig.WorkloadType can only be HIGH_AVAILABILITY if set": CelCheck(
        "nodePoolGroup, nodePoolConfig.workloadType",
        lambda s: (
            "nodePoolGroup" in s or _pool_config(s).get("workloadType", "HIGH_AVAILABILITY") == "HIGH_AVAILABILITY"
        ),
    ),
    "In GKE Standard, pod family can be used only if Autopilot is enabled": CelCheck(
        "priorities[].podFamily, autopilot", lambda s: _autopilot(s) or not any("podFamily" in r for r in _rules(s))
    ),
    "If using NodePoolConfig.ConfidentialNodeType, each priority must specify either MachineFamily or MachineType.": (
        CelCheck(
            "nodePoolConfig.confidentialNodeType, priorities[].machineFamily/machineType",
            lambda s: (
                "confidentialNodeType" not in _pool_config(s)
                or all("machineFamily" in r or "machineType" in r for r in _rules(s))
            ),
        )
    ),
    "ConfidentialNodeType SEV only supports N2D, C2D, C3D, C4D": CelCheck(
        "nodePoolConfig.confidentialNodeType, priorities[].machineFamily/machineType",
        lambda s: not _confidential(s, "SEV") or all(_family_in(r, ("n2d", "c2d", "c3d", "c4d")) for r in _rules(s)),
    ),
    "ConfidentialNodeType SEV_SNP only supports N2D": CelCheck(
        "nodePoolConfig.confidentialNodeType, priorities[].machineFamily/machineType",
        lambda s: not _confidential(s, "SEV_SNP") or all(_family_in(r, ("n2d",)) for r in _rules(s)),
    ),
    "ConfidentialNodeType TDX only supports C3 standard, C4 standard, A3 and A4": CelCheck(
        "nodePoolConfig.confidentialNodeType, priorities[].machineFamily/machineType",
        lambda s: not _confidential(s, "TDX") or all(_tdx_machine(r) for r in _rules(s)),
    ),
    "ConfidentialNodeType TDX on C3 only supports c3-standard- machine type and nvidia-h100-80gb GPU type": CelCheck(
        "nodePoolConfig.confidentialNodeType, priorities[].gpu.type",
        _tdx_gpu("c3", lambda m: m.startswith("c3-standard-"), "nvidia-h100-80gb"),
    ),
    "ConfidentialNodeType TDX on C4 only supports c4-standard- machine type and nvidia-h100-80gb GPU type": CelCheck(
        "nodePoolConfig.confidentialNodeType, priorities[].gpu.type",
        _tdx_gpu("c4", lambda m: m.startswith("c4-standard-"), "nvidia-h100-80gb"),
    ),
    "ConfidentialNodeType TDX on A3 only supports a3-highgpu-1g machine type and nvidia-h100-80gb GPU type": CelCheck(
        "nodePoolConfig.confidentialNodeType, priorities[].gpu.type",
        _tdx_gpu("a3", lambda m: m == "a3-highgpu-1g", "nvidia-h100-80gb"),
    ),
    "ConfidentialNodeType TDX on A4 only supports a4-highgpu-8g machine type and nvidia-b200 GPU type": CelCheck(
        "nodePoolConfig.confidentialNodeType, priorities[].gpu.type",
        _tdx_gpu("a4", lambda m: m == "a4-highgpu-8g", "nvidia-b200"),
    ),
    "PriorityScore must be set for all priorities or for none of them": CelCheck(
        "priorities[].priorityScore", lambda s: len({"priorityScore" in r for r in _rules(s)}) <= 1
    ),
    # spec.priorities[]
    "Nodepool field cannot be set along with other fields": CelCheck(
        "nodepools", lambda r: "nodepools" not in r or len(r) == 1
    ),
    "MachineFamily and MachineType cannot be set together": CelCheck(
        "machineFamily, machineType", lambda r: not _both(r, "machineFamily", "machineType")
    ),
    "MachineType cannot be set together with MinCores/MinMemoryGb": CelCheck(
        "machineType, minCores/minMemoryGb",
        lambda r: "machineType" not in r or not ("minCores" in r or "minMemoryGb" in r),
    ),
    "MachineFamily cannot be equal to 'ek'": CelCheck("machineFamily", lambda r: r.get("machineFamily") != "ek"),
    "MachineType cannot start with 'ek' prefix": CelCheck(
        "machineType", lambda r: not r.get("machineType", "").startswith("ek")
    ),
    "MachineFamily cannot be equal to 'e4a'": CelCheck("machineFamily", lambda r: r.get("machineFamily") != "e4a"),
    "MachineType cannot start with 'e4a' prefix": CelCheck(
        "machineType", lambda r: not r.get("machineType", "").startswith("e4a")
    ),
    "Flex Start provisioning model is incompatible with Spot": CelCheck(
        "flexStart.enabled, spot", lambda r: not (r.get("spot") is True and _flex_start(r))
    ),
    "capacityCheckWaitTimeSeconds is only supported for Flex Start and for multi-host TPUs": CelCheck(
        "capacityCheckWaitTimeSeconds",
        lambda r: "capacityCheckWaitTimeSeconds" not in r or "tpu" in r or _flex_start(r),
    ),
    "acceleratorNetworkProfile must be 'auto' or start with 'auto-'": CelCheck(
        "acceleratorNetworkProfile", lambda v: v == "auto" or v.startswith("auto-")
    ),
    # spec.priorities[].reservations
    "Unable to set specific reservations for non specific affinity": CelCheck(
        "reservations.affinity, reservations.specific", lambda v: not v.get("specific") or v["affinity"] == "Specific"
    ),
    "At least 1 specific reservation required for specific affinity": CelCheck(
        "reservations.affinity, reservations.specific", lambda v: v["affinity"] != "Specific" or bool(v.get("specific"))
    ),
    # nodeSystemConfig (in priorities[] and priorityDefaults)
    "ImageGcLowThresholdPercent must be lower than imageGcHighThresholdPercent": CelCheck(
        "kubeletConfig.imageGcLowThresholdPercent, imageGcHighThresholdPercent",
        lambda k: (
            not _both(k, "imageGcHighThresholdPercent", "imageGcLowThresholdPercent")
            or k["imageGcHighThresholdPercent"] > k["imageGcLowThresholdPercent"]
        ),
    ),
    "ImageGcHighThresholdPercent must be higher than 80 which is default value of imageGcLowThresholdPercent": (
        CelCheck(
            "kubeletConfig.imageGcHighThresholdPercent",
            lambda k: (
                "imageGcHighThresholdPercent" not in k
                or "imageGcLowThresholdPercent" in k
                or k["imageGcHighThresholdPercent"] > 80
            ),
        )
    ),
    "only one of bootDiskProfile, ephemeralLocalSsdProfile, or dedicatedLocalSsdProfile may be set": CelCheck(
        "swapConfig.bootDiskProfile/ephemeralLocalSsdProfile/dedicatedLocalSsdProfile",
        lambda c: sum(p in c for p in ("bootDiskProfile", "ephemeralLocalSsdProfile", "dedicatedLocalSsdProfile")) <= 1,
    ),
    "only one of swapSizeGib or swapSizePercent may be set": CelCheck(
        "swapSizeGib, swapSizePercent", lambda p: not _both(p, "swapSizeGib", "swapSizePercent")
    ),
}
TRANSITION_RULES = frozenset({"Autopilot is required once set", "Autopilot is immutable"})
"""Update-only rules (they compare with `oldSelf`, the stored object): nothing to check on a manifest alone."""


# ------------------------------------------------------------------------------------------- validation
@functools.lru_cache(maxsize=8)
def _schema(filename: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMA_DIR / filename).read_text())
    return schema


@functools.lru_cache(maxsize=8)
def _validator(filename: str) -> jsonschema.protocols.Validator:
    schema = _schema(filename)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}"


def _path(parts: Iterable[Any]) -> str:
    return "/".join(map(str, parts)) or "(root)"


def defaulted(value: Any, schema: Node) -> Any:
    """A copy of `value` with the schema's defaults filled in, as the API server fills a custom resource's
    defaults before it validates (a missing field whose parent exists takes its default, recursively).
    The CEL rules see these: an Autopilot class without nodePoolAutoCreation gets `enabled: false`.
    """
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        filled = {k: copy.deepcopy(p["default"]) for k, p in properties.items() if k not in value and "default" in p}
        return {k: defaulted(v, properties.get(k, {})) for k, v in {**value, **filled}.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [defaulted(item, schema["items"]) for item in value]
    return value


def _cel_nodes(value: Any, schema: Node, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any, str]]:
    """(path, value, rule message) for every CEL rule the schema puts on this value or below it."""
    for rule in schema.get("x-kubernetes-validations", []):
        if rule["message"] not in TRANSITION_RULES:
            yield path, value, rule["message"]
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key, child in value.items():
            if key in properties:
                yield from _cel_nodes(child, properties[key], (*path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, child in enumerate(value):
            yield from _cel_nodes(child, schema["items"], (*path, index))


def _cel_problem(path: tuple[Any, ...], value: Any, message: str) -> str | None:
    check = CEL_CHECKS.get(message)
    if check is None:
        return f"{_path(path)}: CEL rule {message!r} is in the schema but Interlude does not enforce it"
    return None if check.ok(value) else f"{_path(path)}: {check.fields}: {message}"


def cel_problems(obj: dict[str, Any], filename: str) -> list[str]:
    """The CRD's CEL rules an object (defaulted, and valid against the structural schema) breaks."""
    found = (_cel_problem(*node) for node in _cel_nodes(obj, _schema(filename), ()))
    return [p for p in found if p is not None]


def problems(obj: dict[str, Any], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    """Every schema violation of one object ([] when valid), each prefixed with kind/name.

    Custom resources are checked as the API server checks them: `status` dropped (a CRD with the status
    subresource discards it on create and update, so Google's reference example may carry any), defaults
    filled in, then the structural schema, then the CEL rules, which run only once the schema holds (like
    the API server's rules they assume well-typed fields, and a type error is the clearer message anyway).
    """
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key in CUSTOM_SCHEMAS:
        filename = CUSTOM_SCHEMAS[key]
        body = {k: v for k, v in obj.items() if k != "status"}  # both CRDs have the status subresource
        full = defaulted(body, _schema(filename))
        errors = sorted(_validator(filename).iter_errors(full), key=lambda e: list(e.absolute_path))
        found = [f"{_path(e.absolute_path)}: {e.message}" for e in errors] or cel_problems(full, filename)
        return [f"{_where(obj)}: {p}" for p in found]
    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{_where(obj)}: {_path(exc.absolute_path)}: {exc.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [f"{_where(obj)}: no schema for {key[0]} {key[1]} in Kubernetes {kubernetes_version} ({exc!r})"]
    return []


def validate_all(objects: Iterable[dict[str, Any]], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    return [p for obj in objects for p in problems(obj, kubernetes_version)]
