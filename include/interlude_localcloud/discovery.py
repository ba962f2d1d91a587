"""Google's discovery documents as the local cloud's spec: response validation and enum (de)coding.

The discovery documents shipped inside google-api-python-client are the machine-readable truth for
field names and enum values. Validating every response against them keeps the local cloud from
drifting away from Google's wire format; the same schema walk converts enums between names and the
proto numbers that the proto-based REST clients (tpu_v2) send and ask for.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import googleapiclient

DOCS_DIR = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"

# Output fields a resource must always carry (the discovery document cannot say "output, always set").
REQUIRED_OUTPUT: dict[tuple[str, str], tuple[str, ...]] = {
    ("tpu", "Node"): ("name", "state", "createTime", "acceleratorType", "runtimeVersion"),
    ("tpu", "Operation"): ("name",),
    ("tpu", "QueuedResource"): ("name", "state", "createTime"),
    ("tpu", "AcceleratorType"): ("name", "type"),
    ("tpu", "RuntimeVersion"): ("name", "version"),
    ("compute", "Instance"): ("name", "id", "status", "selfLink", "zone", "machineType", "kind"),
    ("compute", "Operation"): ("name", "id", "status", "selfLink", "operationType", "kind"),
    ("compute", "Region"): ("name", "status", "selfLink", "kind"),
    ("container", "Cluster"): (
        "name",
        "location",
        "endpoint",
        "status",
        "selfLink",
        "masterAuth",
        "currentMasterVersion",
        "createTime",
    ),
    ("container", "NodePool"): ("name", "config", "status", "version", "selfLink"),
    ("container", "Operation"): ("name", "operationType", "status", "selfLink", "startTime"),
}

_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


@functools.cache
def load(doc: str) -> dict[str, Any]:
    """Load a discovery document by file stem, e.g. "tpu.v2" or "compute.v1"."""
    return json.loads((DOCS_DIR / f"{doc}.json").read_text())


_PROTO_TYPES = {"tpu": "google.cloud.tpu_v2.types", "container": "google.cloud.container_v1.types"}
ENUM_NUMBERS_FILE = Path(__file__).with_name("enum_numbers.json")


def proto_enum_numbers(family: str) -> dict[tuple[str, str], dict[str, int]]:
    """(message name, json field name) -> {enum name: proto number}, from the installed protos
    (tpu_v2, container_v1).

    Discovery lists enum names in order but proto numbers have gaps (Node.State STOPPED=8), so the
    numbers must come from the proto descriptors. Importing the client package costs a local cloud ~0.5 CPU-s,
    so the server reads the same table from ENUM_NUMBERS_FILE instead (tests/include/interlude_localcloud/
    test_discovery.py
    checks that file against this function, so a client upgrade that renumbers an enum fails there).
    """
    import importlib

    tpu_types = importlib.import_module(_PROTO_TYPES[family])
    table: dict[tuple[str, str], dict[str, int]] = {}

    def visit(descriptor: Any) -> None:
        for field in descriptor.fields:
            if field.enum_type is not None:
                table[(descriptor.name, field.json_name)] = {v.name: v.number for v in field.enum_type.values}
        for nested in descriptor.nested_types:
            visit(nested)

    for name in dir(tpu_types):
        cls = getattr(tpu_types, name)
        pb = getattr(cls, "pb", None)
        if isinstance(cls, type) and callable(pb):
            try:
                visit(pb().DESCRIPTOR)
            except (TypeError, AttributeError):
                continue
    return table


def enum_numbers_document() -> dict[str, dict[str, dict[str, int]]]:
    """ENUM_NUMBERS_FILE's content: family -> "Message.jsonField" -> {enum name: proto number}."""
    return {
        family: {
            f"{message}.{field}": numbers for (message, field), numbers in sorted(proto_enum_numbers(family).items())
        }
        for family in sorted(_PROTO_TYPES)
    }


@functools.cache
def _proto_enum_numbers(family: str) -> dict[tuple[str, str], dict[str, int]]:
    """proto_enum_numbers(family), as shipped in ENUM_NUMBERS_FILE."""
    shipped: dict[str, dict[str, int]] = json.loads(ENUM_NUMBERS_FILE.read_text()).get(family, {})
    table: dict[tuple[str, str], dict[str, int]] = {}
    for key, numbers in shipped.items():
        message, field = key.split(".", 1)
        table[(message, field)] = numbers
    return table


def enum_numbers(family: str, schema_id: str, prop: str, names: list[str]) -> dict[str, int]:
    """Name -> number for one enum field: proto numbers when known, else the discovery order."""
    if family in _PROTO_TYPES:
        known = _proto_enum_numbers(family).get((schema_id, prop))
        if known:
            return known
    return {n: i for i, n in enumerate(names)}


def _resolve(doc: dict[str, Any], schema: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    if "$ref" in schema:
        return schema["$ref"], doc["schemas"][schema["$ref"]]
    return None, schema


_PACKED = re.compile(r"type\.googleapis\.com/google\.cloud\.\w+\.\w+\.(\w+)")


def _packed_schema(doc: dict[str, Any], schema: dict[str, Any], val: Any) -> str | None:
    """The schema inside a `google.protobuf.Any` (an Operation's `response`/`metadata`), if the doc has it.

    Discovery types these as objects of `any` ("Contains field @type with type URL"), so without this
    the Node a create operation returns would escape validation and enum encoding.
    """
    extra = schema.get("additionalProperties")
    if "properties" in schema or not isinstance(extra, dict) or extra.get("type") != "any":
        return None
    m = _PACKED.fullmatch(val.get("@type", "")) if isinstance(val, dict) else None
    return m.group(1) if m and m.group(1) in doc["schemas"] else None


def transform_enums(
    doc_name: str, schema_ref: str, value: Any, fn: Callable[[str, str, dict[str, int], Any], Any]
) -> Any:
    """Return a copy of value with fn(schema_id, prop, name->number, v) applied to every enum value."""
    doc = load(doc_name)
    family = doc_name.split(".")[0]

    def walk(schema: dict[str, Any], val: Any, owner: str, prop: str) -> Any:
        ref, schema = _resolve(doc, schema)
        owner = ref or owner
        if isinstance(val, dict):
            packed = _packed_schema(doc, schema, val)
            if packed is not None:
                unpacked = {k: v for k, v in val.items() if k != "@type"}
                return {"@type": val["@type"], **walk({"$ref": packed}, unpacked, packed, "")}
            props = schema.get("properties")
            if props is not None:
                return {k: (walk(props[k], v, owner, k) if k in props else v) for k, v in val.items()}
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict) and extra.get("type") != "any":
                return {k: walk(extra, v, owner, prop) for k, v in val.items()}
            return val
        if isinstance(val, list) and "items" in schema:
            return [walk(schema["items"], v, owner, prop) for v in val]
        if "enum" in schema and not isinstance(val, (dict, list)):
            return fn(owner, prop, enum_numbers(family, owner, prop, schema["enum"]), val)
        return val

    return walk({"$ref": schema_ref}, value, schema_ref, "")


def enums_to_names(doc_name: str, schema_ref: str, value: Any) -> Any:
    """Decode a request body: enum numbers (as the proto REST clients send them) become names."""

    def fn(_owner: str, _prop: str, numbers: dict[str, int], v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            for name, number in numbers.items():
                if number == v:
                    return name
        return v

    return transform_enums(doc_name, schema_ref, value, fn)


def enums_to_numbers(doc_name: str, schema_ref: str, value: Any) -> Any:
    """Encode a response for `$alt=json;enum-encoding=int`."""

    def fn(_owner: str, _prop: str, numbers: dict[str, int], v: Any) -> Any:
        return numbers.get(v, v) if isinstance(v, str) else v

    return transform_enums(doc_name, schema_ref, value, fn)


def validate(
    doc_name: str, schema_ref: str, value: Any, *, int_enums: bool = False, request: bool = False
) -> list[str]:
    """Check value against the schema; return human-readable violations (empty when valid).

    Checks: no unknown fields, JSON types, enum membership, RFC3339 for google-datetime, int64 as
    strings, and (for responses) the output fields listed in REQUIRED_OUTPUT on every resource the
    server answers with: the response itself, or the resources a list/envelope response carries
    (ListNodesResponse.nodes[], InstanceList.items[]). A resource nested inside another resource is
    not the server's own: QueuedResource.tpu.nodeSpec[].node is the Node *template* the user sent
    (NodeSpec.node is "Required. The node." in tpu.v2.json, an input), and Google echoes it without
    the fields tpu.v2.json marks readOnly/"Output only" (Node.name, state, createTime, ...).
    """
    v = _Validator(load(doc_name), doc_name.split(".")[0], int_enums=int_enums, request=request)
    v.walk({"$ref": schema_ref}, value, "$", schema_ref, "", True)
    return v.errors


@dataclasses.dataclass
class _Validator:
    """One validation pass: the document, the options, and the violations found so far."""

    doc: dict[str, Any]
    family: str
    int_enums: bool = False
    request: bool = False
    errors: list[str] = dataclasses.field(default_factory=list)

    def walk(self, schema: dict[str, Any], val: Any, path: str, owner: str, prop: str, served: bool) -> None:
        ref, schema = _resolve(self.doc, schema)
        owner = ref or owner
        typ = schema.get("type")
        if typ == "any" or val is None and self.request:
            return
        if ref is not None or typ == "object":
            self._object(schema, val, path, owner, ref, served)
        elif typ == "array":
            self._array(schema, val, path, owner, prop, served)
        elif typ == "string":
            self._string(schema, val, path, owner, prop)
        else:
            self._scalar(typ, val, path)

    def _object(self, schema: dict[str, Any], val: Any, path: str, owner: str, ref: str | None, served: bool) -> None:
        if not isinstance(val, dict):
            self.errors.append(f"{path}: expected object ({owner}), got {type(val).__name__}")
            return
        packed = _packed_schema(self.doc, schema, val)
        if packed is not None:  # the resource an operation returns is the server's own: served
            self.walk({"$ref": packed}, {k: v for k, v in val.items() if k != "@type"}, path, packed, "", True)
            return
        resource = ref is not None and (self.family, ref) in REQUIRED_OUTPUT
        # Below a resource, every nested resource is a template or a copy the user sent
        # (QueuedResource.tpu.nodeSpec[].node): its output fields are legitimately absent.
        inner = served and not resource
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in val.items():
            if props is not None and k in props:
                self.walk(props[k], v, f"{path}.{k}", owner, k, inner)
            elif isinstance(extra, dict):
                self.walk(extra, v, f"{path}.{k}", owner, k, inner)
            elif props is not None:
                self.errors.append(f"{path}: unknown field {k!r} in {owner}")
        if props is not None and resource and served and not self.request:
            assert ref is not None
            missing = [req for req in REQUIRED_OUTPUT[(self.family, ref)] if req not in val]
            self.errors.extend(f"{path}: output field {req!r} of {ref} not set" for req in missing)

    def _array(self, schema: dict[str, Any], val: Any, path: str, owner: str, prop: str, served: bool) -> None:
        if not isinstance(val, list):
            self.errors.append(f"{path}: expected array, got {type(val).__name__}")
            return
        for i, item in enumerate(val):
            self.walk(schema.get("items", {}), item, f"{path}[{i}]", owner, prop, served)

    def _string(self, schema: dict[str, Any], val: Any, path: str, owner: str, prop: str) -> None:
        if "enum" in schema:
            numbers = enum_numbers(self.family, owner, prop, schema["enum"])
            as_number = (self.int_enums or self.request) and isinstance(val, int) and val in numbers.values()
            if not (val in schema["enum"] or as_number):
                self.errors.append(f"{path}: {val!r} is not a valid {owner}.{prop} enum value")
            return
        if not isinstance(val, str):
            self.errors.append(f"{path}: expected string, got {type(val).__name__}")
            return
        if schema.get("format") == "google-datetime" and not _DATETIME.match(val):
            self.errors.append(f"{path}: {val!r} is not an RFC3339 timestamp")
        if schema.get("format") in ("int64", "uint64") and not re.fullmatch(r"-?\d+", val):
            self.errors.append(f"{path}: {val!r} is not an int64 string")

    def _scalar(self, typ: str | None, val: Any, path: str) -> None:
        is_int = isinstance(val, int) and not isinstance(val, bool)
        if typ == "integer" and not is_int:
            if not (self.request and isinstance(val, str) and val.lstrip("-").isdigit()):
                self.errors.append(f"{path}: expected integer, got {val!r}")
        elif typ == "number" and (not isinstance(val, (int, float)) or isinstance(val, bool)):
            self.errors.append(f"{path}: expected number, got {val!r}")
        elif typ == "boolean" and not isinstance(val, bool):
            self.errors.append(f"{path}: expected boolean, got {val!r}")
