"""The Kubernetes API over HTTP (FastAPI): discovery, CRUD, watch, patch/apply, pod logs.

Paths, verbs, content types and answers follow https://kubernetes.io/docs/reference/using-api/api-concepts/ :
`/api/v1[/namespaces/{ns}]/{plural}[/{name}[/{sub}]]` and `/apis/{group}/{version}/...`. Like GKE, a
request without `Authorization: Bearer ...` is answered 401; any bearer token is accepted (GKE
accepts any Google access token of an authorised principal).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from interlude_localcloud.gke import (
    defaults,
    eviction,
    patching,
    pod_logs,
    request_options,
    resources,
    scale,
    selectors,
    watching,
)
from interlude_localcloud.gke.resources import ResourceType
from interlude_localcloud.gke.status import KubeError, bad_request, success
from interlude_localcloud.gke.store import Store
from interlude_localcloud.gke.validation import CUSTOM_SCHEMAS, Admission

WATCH_TIMEOUT = 1800.0
_RETURNS_OBJECT_ON_DELETE = {"pods", "namespaces", "computeclasses"}


class RequestLog:
    """What the cluster's API server was asked, at arrival: {t (wall clock, epoch seconds), method, path, query},
    oldest first, the newest REQUESTS_KEPT. The cloud's own record of a client's looks and writes (a controller's
    polls, an apply), for tests to order them against the cluster's events (whose ``at`` is the same clock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: deque[dict[str, Any]] = deque(maxlen=REQUESTS_KEPT)

    def add(self, method: str, path: str, query: str) -> None:
        with self._lock:
            self._items.append({"t": time.time(), "method": method, "path": path, "query": query})

    def since(self, t: float) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self._items if r["t"] >= t]


REQUESTS_KEPT = 100_000


@dataclass(frozen=True)
class Target:
    rt: ResourceType
    namespace: str | None  # None: all namespaces (lists/watches) or a cluster-scoped kind
    name: str
    sub: str


def _parse(group: str, version: str, rest: str) -> Target:
    seg = [s for s in rest.split("/") if s]
    ns: str | None = None
    if seg and seg[0] == "namespaces" and len(seg) >= 3 and seg[2] not in ("status", "finalize"):
        ns, seg = seg[1], seg[2:]
    rt = resources.find(group, version, seg[0]) if seg else None
    if rt is None or len(seg) > 3 or (ns is not None and not rt.namespaced):
        raise KubeError(404, "NotFound", "the server could not find the requested resource", {})
    name = seg[1] if len(seg) > 1 else ""
    sub = seg[2] if len(seg) > 2 else ""
    if sub and sub not in rt.subresources:
        raise KubeError(404, "NotFound", "the server could not find the requested resource", {})
    if rt.namespaced and name and ns is None:
        raise KubeError(404, "NotFound", "the server could not find the requested resource", {})
    return Target(rt, ns if rt.namespaced else None, name, sub)


def _manager(request: Request) -> str:
    explicit = request.query_params.get("fieldManager")
    if explicit:
        return explicit
    agent = request.headers.get("user-agent", "unknown")
    return agent.split("/")[0] or "unknown"


class KubeApi:
    def __init__(self, store: Store, admission: Admission, version: str) -> None:
        self.store = store
        self.admission = admission
        self.version = version  # e.g. 1.33.5-gke.1080000

    # body handling ---------------------------------------------------------------------------
    async def _body(self, request: Request) -> Any:
        raw = await request.body()
        ctype = request.headers.get("content-type", "application/json").split(";")[0].strip()
        try:
            return yaml.safe_load(raw) if ctype == "application/apply-patch+yaml" else json.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as e:
            raise bad_request(f"the object provided is unrecognized or malformed: {e}") from e

    def _admit_fields(self, t: Target, obj: dict[str, Any], request: Request, headers: dict[str, str]) -> None:
        """fieldValidation: Strict rejects undeclared fields (400), Warn (default) drops them with a Warning."""
        mode = request.query_params.get("fieldValidation", "Warn")
        if mode == "Strict":
            unknown = self.admission.unknown_fields(t.rt, obj) if t.rt.kind not in CUSTOM_SCHEMAS else []
            if unknown:
                raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
            return
        dropped = self.admission.prune(t.rt, obj)
        if dropped and mode == "Warn":
            headers["Warning"] = ", ".join(f'299 - "unknown field \\"{d}\\""' for d in dropped)

    def _check_identity(self, t: Target, obj: Any, name: str | None) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise bad_request("the object provided is unrecognized or malformed")
        if obj.get("kind") not in (None, t.rt.kind) or obj.get("apiVersion") not in (None, t.rt.api_version):
            raise bad_request(
                f"the API version in the data ({obj.get('apiVersion')}) does not match the expected "
                f"API version ({t.rt.api_version})"
            )
        meta = obj.setdefault("metadata", {}) or {}
        obj["metadata"] = meta
        body_ns = meta.get("namespace")
        if t.rt.namespaced and body_ns and body_ns != t.namespace:
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        if name is not None and meta.get("name") not in (None, name):
            raise bad_request("the name of the object does not match the name on the URL")
        if name is not None:
            meta["name"] = name
        return obj

    # verbs -----------------------------------------------------------------------------------
    async def get(self, t: Target, request: Request) -> Response:
        q = request.query_params
        if t.name and t.sub == "scale":
            return JSONResponse(scale.to_scale(self.store.get(t.rt, t.namespace or "", t.name)))
        if t.name and t.sub == "log":
            self.store.get(t.rt, t.namespace or "", t.name)
            if q.get("follow", "").lower() in ("true", "1"):
                timeout = float(q.get("timeoutSeconds") or WATCH_TIMEOUT)
                logs = pod_logs.follow(self.store, t.rt, t.namespace or "", t.name, timeout)
                return StreamingResponse(logs, media_type="text/plain")
            lines = self.store.logs.get((t.namespace or "", t.name), [])
            tail = q.get("tailLines")
            if tail:
                lines = lines[-int(tail) :] if int(tail) > 0 else []
            return PlainTextResponse("".join(line if line.endswith("\n") else line + "\n" for line in lines))
        if t.name:
            return JSONResponse(self.store.get(t.rt, t.namespace or "", t.name))
        pred = _and(selectors.label_selector(q.get("labelSelector")), selectors.field_selector(q.get("fieldSelector")))
        if q.get("watch", "").lower() in ("true", "1"):
            timeout = float(q.get("timeoutSeconds") or WATCH_TIMEOUT)
            gen = watching.stream(self.store, t.rt, t.namespace, q.get("resourceVersion"), pred, timeout)
            return StreamingResponse(gen, media_type="application/json")
        items, rv = self.store.list(t.rt, t.namespace, pred)
        meta: dict[str, Any] = {"resourceVersion": rv}
        start = int(json.loads(base64.b64decode(q["continue"]))["start"]) if q.get("continue") else 0
        limit = int(q.get("limit") or 0)
        if limit and start + limit < len(items):
            meta["continue"] = base64.b64encode(json.dumps({"start": start + limit, "rv": rv}).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
        items = items[start : start + limit] if limit else items[start:]
        return JSONResponse(
            {"kind": f"{t.rt.kind}List", "apiVersion": t.rt.api_version, "metadata": meta, "items": items}
        )

    async def create(self, t: Target, request: Request) -> Response:
        if t.name and t.sub == "binding":
            return self._bind(t, await self._body(request))
        if t.name and t.sub == "eviction":
            return JSONResponse(eviction.evict(self.store, t.namespace or "", t.name, await self._body(request)), 201)
        if t.name:
            raise KubeError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        obj = self._check_identity(t, await self._body(request), None)
        headers: dict[str, str] = {}
        self._admit_fields(t, obj, request, headers)
        obj.pop("status", None)  # status is the controllers' (the status subresource), not the creator's
        defaults.apply(t.rt, obj)
        patching.record_update(None, obj, _manager(request), t.rt.api_version)
        dry = request_options.dry_run(request, "CreateOptions")
        created = self.store.create(t.rt, t.namespace or "", obj, dry_run=dry)
        return JSONResponse(created, status_code=201, headers=headers)

    async def replace(self, t: Target, request: Request) -> Response:
        dry = request_options.dry_run(request, "UpdateOptions")
        if t.sub == "scale":
            body = await self._body(request)
            return self._scale(t, lambda _cur: body if isinstance(body, dict) else {}, dry)
        obj = self._check_identity(t, await self._body(request), t.name)
        headers: dict[str, str] = {}
        self._admit_fields(t, obj, request, headers)
        manager = _manager(request)

        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            new = dict(obj)
            defaults.apply(t.rt, new)
            patching.record_update(cur, new, manager, t.rt.api_version, t.sub)
            return new

        updated = self.store.update(t.rt, t.namespace or "", t.name, mutate, t.sub, dry_run=dry)
        return JSONResponse(updated, headers=headers)

    async def patch(self, t: Target, request: Request) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        body = await self._body(request)
        manager = _manager(request)
        ns = t.namespace or ""
        dry = request_options.dry_run(request, "PatchOptions")
        if t.sub == "scale" and ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return self._scale(t, lambda cur: patching.merge_patch(cur, body), dry)
        if ctype == "application/apply-patch+yaml":
            return self._apply(t, body, request, dry)
        patcher = {
            "application/merge-patch+json": patching.merge_patch,
            "application/strategic-merge-patch+json": patching.strategic_merge,
            "application/json-patch+json": patching.json_patch,
        }.get(ctype)
        if patcher is None:
            raise KubeError(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - "
                "accepted media types include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml, application/strategic-merge-patch+json",
            )
        headers: dict[str, str] = {}

        def mutate(cur: dict[str, Any]) -> dict[str, Any]:
            new = patcher(cur, body)
            if not isinstance(new, dict):
                raise bad_request("the patch did not produce an object")
            self._admit_fields(t, new, request, headers)
            defaults.apply(t.rt, new)
            patching.record_update(cur, new, manager, t.rt.api_version, t.sub)
            return new

        return JSONResponse(self.store.update(t.rt, ns, t.name, mutate, t.sub, dry_run=dry), headers=headers)

    def _apply(self, t: Target, body: Any, request: Request, dry: bool) -> Response:
        obj = self._check_identity(t, body, t.name)
        manager = request.query_params.get("fieldManager", "")
        force = request.query_params.get("force", "").lower() in ("true", "1")
        ns = t.namespace or ""
        headers: dict[str, str] = {}
        self._admit_fields(t, obj, request, headers)
        with self.store.lock:
            if not self.store.exists(t.rt, ns, t.name):
                new = patching.server_side_apply(None, obj, manager, force, t.rt.api_version)
                defaults.apply(t.rt, new)
                created = self.store.create(t.rt, ns, new, dry_run=dry)
                return JSONResponse(created, status_code=201, headers=headers)

            def mutate(cur: dict[str, Any]) -> dict[str, Any]:
                new = patching.server_side_apply(cur, obj, manager, force, t.rt.api_version)
                defaults.apply(t.rt, new)
                return new

            return JSONResponse(self.store.update(t.rt, ns, t.name, mutate, t.sub, dry_run=dry), headers=headers)

    def _bind(self, t: Target, binding: Any) -> Response:
        """`pods/{name}/binding` (what a scheduler POSTs): sets spec.nodeName once, PodScheduled True."""
        target = (binding or {}).get("target") or {} if isinstance(binding, dict) else {}
        node = target.get("name")
        if not node:
            raise bad_request("Binding.target.name is required")

        def mutate(pod: dict[str, Any]) -> dict[str, Any]:
            if pod["spec"].get("nodeName"):
                raise KubeError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on pods/binding "{t.name}": pod '
                    f'{t.name} is already assigned to node "{pod["spec"]["nodeName"]}"',
                )
            pod["spec"]["nodeName"] = node
            current = (pod.get("status") or {}).get("conditions") or []
            conditions = [c for c in current if c.get("type") != "PodScheduled"]
            pod.setdefault("status", {})["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True"}]
            return pod

        self.store.update(t.rt, t.namespace or "", t.name, mutate, "binding")
        return JSONResponse(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status_code=201
        )

    def _scale(self, t: Target, new_scale: Any, dry: bool) -> Response:
        updated = self.store.update(t.rt, t.namespace or "", t.name, scale.apply_scale(new_scale), dry_run=dry)
        return JSONResponse(scale.to_scale(updated))

    async def delete(self, t: Target, request: Request) -> Response:
        """Delete honouring DeleteOptions: an object kept by finalizers answers 200 with its new state
        (`deletionTimestamp` set), one gone answers its last state or a `Status`, as the API server does."""
        ns = t.namespace or ""
        opts = request_options.delete_options(request, await self._body(request))

        def remove(namespace: str, name: str) -> tuple[dict[str, Any], bool]:
            pre = opts.preconditions
            return self.store.remove(t.rt, namespace, name, opts.propagation, opts.dry_run, pre)

        if not t.name:  # deletecollection
            pred = selectors.label_selector(request.query_params.get("labelSelector"))
            items, _ = self.store.list(t.rt, t.namespace, pred)
            gone = [remove(o["metadata"].get("namespace") or "", o["metadata"]["name"])[0] for o in items]
            return JSONResponse(
                {
                    "kind": f"{t.rt.kind}List",
                    "apiVersion": t.rt.api_version,
                    "metadata": {"resourceVersion": self.store.resource_version},
                    "items": gone,
                }
            )
        obj, deleted = remove(ns, t.name)
        if not deleted or t.rt.plural in _RETURNS_OBJECT_ON_DELETE:
            return JSONResponse(obj)
        return JSONResponse(success(t.rt, t.name, obj["metadata"]["uid"]))


def _and(a: selectors.Predicate, b: selectors.Predicate) -> selectors.Predicate:
    return lambda o: a(o) and b(o)


async def group_resources(group: str, version: str) -> Response:
    """`/apis/{group}/{version}`: the kinds of one group version (404 for a group version not served)."""
    if version not in resources.GROUPS.get(group, []):
        raise KubeError(404, "NotFound", "the server could not find the requested resource", {})
    return JSONResponse(resources.api_resource_list(group, version))


def _discovery_routes(app: FastAPI, k8s_version: str, server_address: str) -> None:
    minor = k8s_version.split(".")[1]

    @app.get("/version")
    async def version() -> dict[str, Any]:
        return {
            "major": "1",
            "minor": minor,
            "gitVersion": f"v{k8s_version}",
            "gitTreeState": "clean",
            "gitCommit": "",
            "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "go1.24",
            "compiler": "gc",
            "platform": "linux/amd64",
        }

    @app.get("/api")
    async def core_versions() -> dict[str, Any]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }

    @app.get("/apis")
    async def groups() -> dict[str, Any]:
        return resources.api_group_list()

    @app.get("/api/v1")
    async def core_resources() -> dict[str, Any]:
        return resources.api_resource_list("", "v1")

    app.add_api_route("/apis/{group}/{version}", group_resources, methods=["GET"])


def build_app(api: KubeApi, server_address: str, requests: RequestLog | None = None) -> FastAPI:
    """The API server's app; `requests` (when given) records every request as it arrives (RequestLog)."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def authenticate(request: Request, call_next: Any) -> Response:
        if requests is not None:
            requests.add(request.method, request.url.path, request.url.query)
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or not auth[7:].strip():
            return JSONResponse(KubeError(401, "Unauthorized", "Unauthorized").status(), status_code=401)
        return await call_next(request)

    @app.exception_handler(KubeError)
    async def kube_error(_request: Request, e: KubeError) -> Response:
        return JSONResponse(e.status(), status_code=e.code)

    _discovery_routes(app, api.version, server_address)
    verbs = {"GET": api.get, "POST": api.create, "PUT": api.replace, "PATCH": api.patch, "DELETE": api.delete}

    async def dispatch(group: str, version: str, rest: str, request: Request) -> Response:
        return await verbs[request.method](_parse(group, version, rest), request)

    from interlude_localcloud.gke.service_proxy_api import add_service_proxy  # it needs the runtime's annotation

    add_service_proxy(app, api.store)

    @app.api_route("/api/v1/{rest:path}", methods=list(verbs))
    async def core(rest: str, request: Request) -> Response:
        if not rest.strip("/") and request.method == "GET":
            return JSONResponse(resources.api_resource_list("", "v1"))
        return await dispatch("", "v1", rest, request)

    @app.api_route("/apis/{group}/{version}/{rest:path}", methods=list(verbs))
    async def grouped(group: str, version: str, rest: str, request: Request) -> Response:
        if not rest.strip("/") and request.method == "GET":  # `/apis/policy/v1/`, as the generated clients ask
            return await group_resources(group, version)
        return await dispatch(group, version, rest, request)

    return app
