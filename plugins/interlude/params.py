"""Dataclass fields that are also trigger-form params: shared by the training RunSpec and the ServeSpec.

A spec declares each param once, as a field carrying its JSON schema and description; the DAG's form
is generated from the same fields, so form and code cannot disagree about a default.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import field
from typing import Any

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Control characters (and Unicode line separators): they forge log lines and break URLs."""


QUOTE_CHARS = 80
"""How much of a refused value a message quotes: enough to recognise it, never a 10 kB paste echoed whole into
the task log, the UI's error banner and the failure e-mail."""


def shown(value: Any, limit: int = QUOTE_CHARS) -> str:
    """``repr(value)``, or its first ``limit`` characters and how long it was: how every refusal quotes a value."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}…({len(text)} chars)"


class ParamsError(ValueError):
    """Bad input, found before anything is created or applied: retrying cannot fix it, the params must change."""

    def __init__(self, problems: list[str], heading: str = "invalid parameters") -> None:
        self.problems = problems
        super().__init__(f"{heading}:\n  - " + "\n  - ".join(problems))


DIALECT = "http://json-schema.org/draft-07/schema#"
"""The JSON Schema dialect every param schema declares (https://json-schema.org/draft-07/schema).

Why declare one: Airflow checks each param against its schema with ``jsonschema.validate``, which first
checks the schema itself against its dialect's meta-schema, on every call. Serializing the training DAG
makes ~1,400 such calls (34 params, copied onto each of its 23 tasks), on every parse by the dag-processor
and in every ``airflow dags test``; with no ``$schema`` jsonschema takes the newest dialect (2020-12),
whose meta-schema costs ~3x as much to walk: 0.44 ms -> 0.14 ms a call here,
0.57 s -> 0.22 s per serialization of the training DAG (an `airflow dags test` serializes it two or three times).
The keywords these schemas use (type, enum, minimum/maximum, items, minItems, minLength/maxLength) mean
the same in draft-07 and 2020-12."""


def param(default: Any, schema: dict[str, Any], description: str) -> Any:
    """A field that is also a param of the trigger form (schema is JSON Schema, as Airflow's Param takes)."""
    return field(default=default, metadata={"param": {"$schema": DIALECT, **schema, "description": description}})


def param_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if "param" in f.metadata)


def form_schema(cls: type) -> dict[str, tuple[Any, dict[str, Any]]]:
    """Each param's default and JSON schema, for the DAG's `Param`s (lists for arrays, as JSON has)."""
    out: dict[str, tuple[Any, dict[str, Any]]] = {}
    for f in dataclasses.fields(cls):
        if "param" in f.metadata:
            default = list(f.default) if isinstance(f.default, tuple) else f.default
            out[f.name] = (default, dict(f.metadata["param"]))
    return out


def schema_problems(spec: Any) -> list[str]:
    """Each param field of a spec (a dataclass of ``param`` fields) against its own schema's ``enum``,
    ``minimum`` and ``maximum``: the bounds the trigger form shows are the ones refused here."""
    out: list[str] = []
    for f in dataclasses.fields(spec):
        schema = f.metadata.get("param") or {}
        value = getattr(spec, f.name)
        if "enum" in schema and value not in schema["enum"]:
            out.append(f"{f.name}: {shown(value)} is not one of {', '.join(schema['enum'])}")
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{f.name}: must be at least {schema['minimum']} (got {shown(value)})")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{f.name}: must be at most {schema['maximum']} (got {shown(value)})")
    return out


def coerce_params(cls: type, params: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Each given param in its field's type, and every problem (unknown keys, wrong types) at once."""
    known = param_names(cls)
    problems = [f"unknown param {shown(k)} (known: {', '.join(sorted(known))})" for k in params if k not in known]
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in known and f.name in params:
            try:
                values[f.name] = coerce(f.name, params[f.name], f.default)
            except (TypeError, ValueError) as exc:
                problems.append(str(exc))
    return values, problems


def _as_str(name: str, value: Any, optional: bool) -> str | None:
    if value is None or (optional and value == ""):
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a string, got {type(value).__name__}")
    return value.strip()


def _as_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected true or false, got {shown(value)}")
    return value


def _as_int(name: str, value: Any) -> int:
    text = str(value).strip() if isinstance(value, int | str) else ""
    if isinstance(value, bool) or not text.lstrip("-").isdigit():
        raise TypeError(f"{name}: expected a whole number, got {shown(value)}")
    try:
        return int(text)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits): no param's range anyway
        raise TypeError(f"{name}: expected a whole number, got {shown(value)}") from None


def _as_float(name: str, value: Any) -> float:
    """A finite number. NaN passes every range check (each comparison with it is false) and then disables what
    the param bounds: a NaN ``stall_timeout_seconds`` made the stage machine never act on a stall. Infinities
    are no durations either. Refused here, the one place every number param goes through."""
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected a number, got {shown(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TypeError(f"{name}: expected a number, got {shown(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name}: expected a finite number, got {shown(value)}")
    return number


def _as_strings(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise TypeError(f"{name}: expected a list of strings, got {shown(value)}")
    for item in value:
        if not isinstance(item, str) or CONTROL.search(item):
            raise ValueError(f"{name}: {shown(item)} is not a plain string")
    return tuple(item.strip() for item in value)


def coerce(name: str, value: Any, default: Any) -> Any:
    """The param's value in the field's type (the default's type); '' means "not set" for optional strings."""
    if isinstance(value, str) and CONTROL.search(value):
        raise ValueError(f"{name}: control characters are not allowed ({shown(value)})")
    if default is None or isinstance(default, str):
        return _as_str(name, value, optional=default is None)
    if isinstance(default, bool):  # before int: bool is an int
        return _as_bool(name, value)
    if isinstance(default, int):
        return _as_int(name, value)
    if isinstance(default, float):
        return _as_float(name, value)
    return _as_strings(name, value)
