"""PATCH semantics: JSON patch, JSON merge patch, strategic merge patch and server-side apply.

- merge patch: RFC 7386 (null deletes, objects merge, lists replace).
- strategic merge patch: lists with a patch merge key merge item by item (containers by name, ports
  by containerPort/port, env by name, ...), `$patch: delete|replace` directives; other lists replace
  (https://kubernetes.io/docs/tasks/manage-kubernetes-objects/update-api-object-kubectl-patch/).
- server-side apply: each field manager owns the fields it applied (metadata.managedFields, FieldsV1);
  applying a field another manager owns with a different value is a 409 Conflict unless force=true;
  fields a manager applied before and omits now are removed when nobody else owns them
  (https://kubernetes.io/docs/reference/using-api/server-side-apply/).
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

from interlude_localcloud.gke.status import KubeError, bad_request

Obj = dict[str, Any]
Path = tuple[str, ...]

# Patch merge keys of the list fields we use (from the Kubernetes OpenAPI x-kubernetes-patch-merge-key).
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "metrics": "",
    "taints": "key",
    "tolerations": "",
}
_PORT_KEYS = ("containerPort", "port")
_IGNORED_META = {
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "generateName",
}


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _merge_key(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        return next((k for k in _PORT_KEYS if items and all(isinstance(i, dict) and k in i for i in items)), None)
    key = MERGE_KEYS.get(field)
    return key or None


def _merge_list(field: str, cur: list[Any], patch: list[Any]) -> list[Any]:
    key = _merge_key(field, patch or cur)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return copy.deepcopy([p for p in patch if not (isinstance(p, dict) and "$patch" in p)])
    out = copy.deepcopy(cur)
    for item in patch:
        directive = item.get("$patch")
        if directive == "replace":
            return [dict(i) for i in patch if i.get("$patch") != "replace"]
        idx = next((i for i, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item.get(key)), None)
        if directive == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append(copy.deepcopy(item))
        else:
            out[idx] = strategic_merge(out[idx], item)
    return out


def strategic_merge(target: Any, patch: Any, field: str = "") -> Any:
    if isinstance(patch, list):
        return _merge_list(field, target if isinstance(target, list) else [], patch)
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = strategic_merge(out.get(k), v, k)
    return out


def _walk(doc: Any, pointer: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
    cur = doc
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur, parts[-1]


def _put(doc: Any, pointer: str, value: Any, replace: bool) -> None:
    parent, last = _walk(doc, pointer)
    if not isinstance(parent, list):
        if replace and last not in parent:
            raise KeyError(last)
        parent[last] = value
    elif last == "-":
        parent.append(value)
    elif replace:
        parent[int(last)] = value
    else:
        parent.insert(int(last), value)


def _take(doc: Any, pointer: str, remove: bool) -> Any:
    parent, last = _walk(doc, pointer)
    key: Any = int(last) if isinstance(parent, list) else last
    value = parent[key]
    if remove:
        del parent[key]
    return value


def _json_patch_op(doc: Any, op: dict[str, Any]) -> None:
    kind, path = op["op"], op["path"]
    if kind in ("add", "replace"):
        _put(doc, path, copy.deepcopy(op["value"]), kind == "replace")
    elif kind == "remove":
        _take(doc, path, True)
    elif kind == "test":
        if _take(doc, path, False) != op["value"]:
            raise bad_request(f"the server rejected our request due to an error in our request: test failed at {path}")
    elif kind in ("copy", "move"):
        _put(doc, path, copy.deepcopy(_take(doc, op["from"], kind == "move")), False)
    else:
        raise bad_request(f"unknown json patch operation {kind!r}")


def json_patch(target: Obj, ops: list[dict[str, Any]]) -> Obj:
    """RFC 6902 add/remove/replace/test/copy/move."""
    doc: Any = copy.deepcopy(target)
    if not isinstance(ops, list):
        raise bad_request("the JSON patch must be a list of operations")
    try:
        for op in ops:
            _json_patch_op(doc, op)
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise KubeError(422, "Invalid", f"the server rejected our request due to an error in our request: {e!r}") from e
    return doc


# server-side apply --------------------------------------------------------------------------


def field_paths(obj: Any, prefix: Path = (), field: str = "") -> dict[Path, Any]:
    """Leaf paths (FieldsV1 element names) -> values; keyed list items are `k:{...}` elements."""
    out: dict[Path, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not prefix and k in ("apiVersion", "kind", "status"):
                continue
            if prefix == ("f:metadata",) and k in _IGNORED_META:
                continue
            out.update(
                field_paths(v, (*prefix, f"f:{k}"), k)
                if isinstance(v, (dict, list)) and v
                else {(*prefix, f"f:{k}"): v}
            )
        return out
    if isinstance(obj, list):
        key = _merge_key(field, obj)
        if key is None or not all(isinstance(i, dict) for i in obj):
            return {prefix: obj}  # atomic list: owned as a whole
        for item in obj:
            elem = f"k:{json.dumps({key: item.get(key)}, separators=(',', ':'))}"
            out[(*prefix, elem, ".")] = None
            out.update(field_paths({k: v for k, v in item.items()}, (*prefix, elem), ""))
        return out
    return {prefix: obj}


def to_fields_v1(paths: set[Path]) -> Obj:
    root: Obj = {}
    for p in sorted(paths):
        cur = root
        for elem in p:
            cur = cur.setdefault(elem, {})
    return root


def from_fields_v1(tree: Obj, prefix: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for k, v in tree.items():
        if k == ".":
            out.add((*prefix, "."))
        elif isinstance(v, dict) and v:
            out |= from_fields_v1(v, (*prefix, k))
        else:
            out.add((*prefix, k))
    return out


def _value_at(obj: Any, path: Path) -> Any:
    cur = obj
    for elem in path:
        if elem == ".":
            return cur
        if elem.startswith("f:"):
            cur = cur.get(elem[2:]) if isinstance(cur, dict) else None
        else:
            want = json.loads(elem[2:])
            cur = next(
                (i for i in cur or [] if isinstance(i, dict) and all(i.get(a) == b for a, b in want.items())), None
            )
    return cur


def _remove_at(obj: Any, path: Path) -> None:
    parent = _value_at(obj, path[:-1]) if len(path) > 1 else obj
    last = path[-1]
    if last == ".":
        grand = _value_at(obj, path[:-2]) if len(path) > 2 else obj
        if isinstance(grand, list) and parent in grand:
            grand.remove(parent)
    elif isinstance(parent, dict) and last.startswith("f:"):
        parent.pop(last[2:], None)


def _entries(obj: Obj) -> list[Obj]:
    return list((obj.get("metadata") or {}).get("managedFields") or [])


def _owned(entry: Obj) -> set[Path]:
    return from_fields_v1(entry.get("fieldsV1") or {})


def _entry(manager: str, operation: str, api_version: str, paths: set[Path], sub: str = "") -> Obj:
    e = {
        "manager": manager,
        "operation": operation,
        "apiVersion": api_version,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fieldsType": "FieldsV1",
        "fieldsV1": to_fields_v1(paths),
    }
    if sub:
        e["subresource"] = sub
    return e


def server_side_apply(current: Obj | None, applied: Obj, manager: str, force: bool, api_version: str) -> Obj:
    """The object after `manager` applies `applied` to `current` (None: create)."""
    if not manager:
        raise bad_request("PATCH, fieldManager must be set for apply requests")
    applied_paths = field_paths(applied)
    owned_now = set(applied_paths)
    base = copy.deepcopy(current) if current is not None else {}
    entries = _entries(base)
    conflicts: list[tuple[str, str]] = []
    mine_before: set[Path] = set()
    others: list[Obj] = []
    for e in entries:
        paths = _owned(e)
        if e.get("manager") == manager and e.get("operation") == "Apply":
            mine_before = paths
            continue
        clash = {p for p in paths & owned_now if _value_at(base, p) != applied_paths[p]}
        if clash and not force:
            using = f'conflict with "{e.get("manager")}" using {e.get("apiVersion", api_version)}'
            conflicts += [(using, "." + ".".join(x[2:] for x in p if x != ".")) for p in sorted(clash)]
        e = {**e, "fieldsV1": to_fields_v1(paths - owned_now)} if clash or force else e
        others.append(e)
    if conflicts:
        noun = "conflict" if len(conflicts) == 1 else "conflicts"
        text = "; ".join(f"{who}: {where}" for who, where in conflicts)
        raise KubeError(
            409,
            "Conflict",
            f"Apply failed with {len(conflicts)} {noun}: {text}",
            {
                "causes": [
                    {"reason": "FieldManagerConflict", "message": who, "field": where} for who, where in conflicts
                ]
            },
        )
    merged = strategic_merge(base, {k: v for k, v in applied.items() if k != "status"})
    still_owned = set().union(*(_owned(e) for e in others)) if others else set()
    for p in sorted(mine_before - owned_now - still_owned, key=len, reverse=True):
        _remove_at(merged, p)
        for depth in range(len(p) - 1, 0, -1):  # parents left empty by the removal go too
            parent = p[:depth]
            if _value_at(merged, parent) == {} and parent not in owned_now | still_owned:
                _remove_at(merged, parent)
    others = [e for e in others if e.get("fieldsV1")]
    merged.setdefault("metadata", {})["managedFields"] = others + [_entry(manager, "Apply", api_version, owned_now)]
    return _unchanged_if_same(base, merged)


def _unchanged_if_same(base: Obj, merged: Obj) -> Obj:
    """A re-apply that changes no value and no ownership returns the object as it was (timestamps included),
    so the store sees no change and the resourceVersion stays: a no-op apply is not a write on Kubernetes."""

    def strip(obj: Obj) -> Obj:
        return {**obj, "metadata": {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}}

    def key(e: Obj) -> str:
        return json.dumps({k: v for k, v in e.items() if k != "time"}, sort_keys=True)

    if not base or strip(base) != strip(merged):
        return merged
    if sorted(map(key, _entries(base))) != sorted(map(key, _entries(merged))):
        return merged
    return copy.deepcopy(base)


def _scoped(obj: Obj | None, subresource: str) -> dict[Path, Any]:
    if obj is None:
        return {}
    if subresource == "status":
        return field_paths(obj.get("status") or {}, ("f:status",))
    return field_paths(obj)


def record_update(old: Obj | None, new: Obj, manager: str, api_version: str, subresource: str = "") -> None:
    """Give `manager` (operation Update) the fields whose value it set or changed; take them from others."""
    new_paths = _scoped(new, subresource)
    old_paths = _scoped(old, subresource)
    changed = {p for p, v in new_paths.items() if p not in old_paths or old_paths[p] != v}
    present = set(field_paths(new)) | set(_scoped(new, "status"))
    out: list[Obj] = []
    mine: set[Path] = set(changed)
    for e in _entries(old) if old is not None else []:
        paths = _owned(e) & present
        if e.get("manager") == manager and e.get("operation") == "Update" and e.get("subresource", "") == subresource:
            mine |= paths
            continue
        paths -= changed
        if paths:
            out.append({**e, "fieldsV1": to_fields_v1(paths)})
    if mine:
        out.append(_entry(manager, "Update", api_version, mine, subresource))
    new.setdefault("metadata", {})["managedFields"] = out
