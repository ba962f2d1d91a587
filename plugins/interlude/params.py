"""Dataclass fields that are also trigger-form params: shared by the training RunSpec and the ServeSpec.

A spec declares each param once, as a field carrying its JSON schema and description; the DAG's form
is generated from the same fields, so form and code cannot disagree about a default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Any


class ParamsError(ValueError):
    """Bad input, found before anything is created or applied: retrying cannot fix it, the params must change."""

    def __init__(self, problems: list[str], heading: str = "invalid parameters") -> None:
        self.problems = problems
        super().__init__(f"{heading}:\n  - " + "\n  - ".join(problems))


def param(default: Any, schema: dict[str, Any], description: str) -> Any:
    """A field that is also a param of the trigger form (schema is JSON Schema, as Airflow's Param takes)."""
    return field(default=default, metadata={"param": {**schema, "description": description}})


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
