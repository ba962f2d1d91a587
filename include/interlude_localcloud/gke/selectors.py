"""Label and field selectors with the syntax of the Kubernetes API
(https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/#label-selectors)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from interlude_localcloud.gke.status import bad_request

Predicate = Callable[[dict[str, Any]], bool]

_SET = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s*(?:(notin|in)\s*\(([^)]*)\)|(==|=|!=)\s*([A-Za-z0-9._-]*))?\s*$")


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def _requirement(term: str) -> Callable[[dict[str, str]], bool]:
    m = _SET.match(term)
    if not m:
        raise bad_request(f"unable to parse requirement: {term!r}")
    neg, key, set_op, values, op, value = m.groups()
    if neg:
        if set_op or op:
            raise bad_request(f"unable to parse requirement: {term!r}")
        return lambda labels: key not in labels
    if set_op:
        vals = {v.strip() for v in values.split(",") if v.strip()}
        if set_op == "in":
            return lambda labels: labels.get(key) in vals
        return lambda labels: labels.get(key) not in vals
    if op in ("=", "=="):
        return lambda labels: labels.get(key) == value
    if op == "!=":
        return lambda labels: labels.get(key) != value
    return lambda labels: key in labels


def label_selector(selector: str | None) -> Predicate:
    if not selector:
        return lambda _obj: True
    reqs = [_requirement(t) for t in _split(selector)]
    return lambda obj: all(r((obj.get("metadata") or {}).get("labels") or {}) for r in reqs)


def _field_value(obj: dict[str, Any], path: str) -> str:
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def field_selector(selector: str | None) -> Predicate:
    """`metadata.name=x,spec.nodeName!=y`: equality on dotted paths (what the clients we use send)."""
    if not selector:
        return lambda _obj: True
    checks: list[tuple[str, str, bool]] = []
    for term in _split(selector):
        m = re.match(r"^\s*([A-Za-z0-9._]+)\s*(==|=|!=)\s*(.*?)\s*$", term)
        if not m:
            raise bad_request(f"invalid field selector: {term!r}")
        checks.append((m.group(1), m.group(3), m.group(2) == "!="))
    return lambda obj: all((_field_value(obj, p) == v) != neg for p, v, neg in checks)
