"""Partial responses: the ``fields`` system parameter every Google JSON API takes.

A client that needs a few fields of each resource asks for them (``fields=nodes(name,state),nextPageToken``)
and the front end sends only those: less to transfer and, what matters to a triggerer that lists a zone of a
thousand machines every poll, less to parse (a TPU node as listed is ~600 bytes; the four fields a watcher reads
~120). Syntax (https://cloud.google.com/compute/docs/api/how-tos/performance, "Partial response"; the same in
every API on Google's front end):

- ``a,b``: several fields; ``a/b``: field ``b`` inside ``a``; ``a(b,c)``: several fields inside ``a``;
- ``*``: every field (``items/*/name`` style selections of map values);
- a selection inside an array applies to each element; a selected field the resource does not have is omitted;
- a malformed selection, or a field the response's schema does not declare, is a 400 (INVALID_ARGUMENT).

The selection is applied to the response as the API would send it (after the enum encoding): errors are
never filtered.
"""

from __future__ import annotations

import re
from typing import Any

from interlude_localcloud import discovery

Selection = dict[str, "Selection | None"]
"""Field name -> what to keep inside it (None: all of it). ``*`` stands for every field."""

_TOKEN = re.compile(r"\s*([A-Za-z0-9_.@$*-]+|[(),/])")


class FieldsError(ValueError):
    """The ``fields`` value cannot be parsed or names a field the schema does not have."""


def parse(spec: str) -> Selection:
    """``fields`` -> a selection tree; FieldsError on a malformed value."""
    tokens = _tokens(spec)
    selection, pos = _list(tokens, 0)
    if pos != len(tokens):
        raise FieldsError(f"Invalid field selection {spec}")
    return selection


def _tokens(spec: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    spec = spec.strip()
    while pos < len(spec):
        m = _TOKEN.match(spec, pos)
        if m is None:
            raise FieldsError(f"Invalid field selection {spec}")
        tokens.append(m.group(1))
        pos = m.end()
    if not tokens:
        raise FieldsError("Invalid field selection: empty")
    return tokens


def _list(tokens: list[str], pos: int) -> tuple[Selection, int]:
    selection: Selection = {}
    while True:
        path, pos = _path(tokens, pos)
        inner: Selection | None = None
        if pos < len(tokens) and tokens[pos] == "(":
            inner, pos = _list(tokens, pos + 1)
            if pos >= len(tokens) or tokens[pos] != ")":
                raise FieldsError("Invalid field selection: unbalanced parentheses")
            pos += 1
        _merge(selection, path, inner)
        if pos < len(tokens) and tokens[pos] == ",":
            pos += 1
            continue
        return selection, pos


def _path(tokens: list[str], pos: int) -> tuple[list[str], int]:
    path: list[str] = []
    while True:
        if pos >= len(tokens) or tokens[pos] in "(),/":
            raise FieldsError(f"Invalid field selection: a field name expected at {' '.join(tokens[pos : pos + 3])!r}")
        path.append(tokens[pos])
        pos += 1
        if pos < len(tokens) and tokens[pos] == "/":
            pos += 1
            continue
        return path, pos


def _merge(selection: Selection, path: list[str], inner: Selection | None) -> None:
    """Add ``path`` (with ``inner`` at its end) to ``selection``: a field selected whole stays whole."""
    head, rest = path[0], path[1:]
    sub: Selection | None = inner
    for name in reversed(rest):
        sub = {name: sub}
    if head in selection and selection[head] is None:
        return
    if sub is None or head not in selection:
        selection[head] = sub
        return
    current = selection[head]
    assert current is not None
    for name, value in sub.items():
        _merge(current, [name], value)


def select(value: Any, selection: Selection | None) -> Any:
    """``value`` with only the selected fields (each element of an array selected alike)."""
    if selection is None:
        return value
    if isinstance(value, list):
        return [select(v, selection) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    star = selection.get("*", False)
    for key, item in value.items():
        if key in selection:
            out[key] = select(item, selection[key])
        elif star is not False:
            out[key] = select(item, star)  # type: ignore[arg-type]
    return out


def check(doc_name: str, schema_ref: str, selection: Selection) -> None:
    """FieldsError if the selection names a field that ``schema_ref`` (a response schema of ``doc_name``'s
    discovery document) does not declare, as Google's front end refuses it."""
    doc = discovery.load(doc_name)
    _check(doc, {"$ref": schema_ref}, selection, "")


def _check(doc: dict[str, Any], schema: dict[str, Any], selection: Selection, where: str) -> None:
    schema = _object_schema(doc, schema)
    props = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for name, inner in selection.items():
        if name == "*":
            child: dict[str, Any] | None = extra if isinstance(extra, dict) else None
        elif name in props:
            child = props[name]
        elif isinstance(extra, dict):
            child = extra  # a map (labels, metadata): any key
        else:
            raise FieldsError(f"Invalid field selection {where}{name}")
        if inner is not None and child is not None:
            _check(doc, child, inner, f"{where}{name}/")


def _object_schema(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """The object schema a selection applies to: through $refs and array items."""
    while True:
        if "$ref" in schema:
            schema = doc["schemas"][schema["$ref"]]
        elif schema.get("type") == "array":
            schema = schema.get("items") or {}
        else:
            return schema
