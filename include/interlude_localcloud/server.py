"""HTTP front: a threading stdlib server with a regex router, fault injection and strict validation.

Strict mode validates every successful JSON answer against Google's discovery document and turns a
violation into a 500, so a test that talks to the local cloud fails when the wire format drifts.
"""

from __future__ import annotations

import json
import logging
import re
import select
import socket
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from interlude_localcloud import discovery, partial
from interlude_localcloud.cloud import Cloud
from interlude_localcloud.errors import ApiError, injected_fault, invalid

log = logging.getLogger(__name__)


class ClientGone(ConnectionAbortedError):
    """The client hung up before its answer was ready (a killed long-poller): nothing left to answer.

    A ConnectionError like BrokenPipeError/ConnectionResetError, so the server drops all three quietly:
    a guest that dies mid-request is ordinary machine behaviour, not a local cloud defect.
    """


def _never_gone() -> bool:
    return False


@dataclass
class Request:
    method: str
    path: str
    params: dict[str, str]
    query: dict[str, str]
    body: Any
    headers: dict[str, str]
    int_enums: bool = False
    doc: str = ""
    # True once the client has closed its connection; long-polls check it to stop waiting early.
    client_gone: Callable[[], bool] = _never_gone
    raw_body: bytes = b""  # as sent: for the endpoints whose body is not JSON (guest attributes)


@dataclass
class Response:
    """A JSON answer; `schema` names the discovery schema to validate/encode it with."""

    body: Any
    schema: str | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None  # non-JSON answers (metadata server text)


Handler = Callable[[Request], Response]


@dataclass
class Route:
    method: str
    pattern: re.Pattern[str]
    handler: Handler
    doc: str  # discovery doc ("tpu.v2", "compute.v1") or "" for non-Google endpoints
    request_schema: str | None = None
    text_body: bool = False  # the body is a plain value, not JSON (the metadata server's PUTs)


class Router:
    def __init__(self) -> None:
        self.routes: list[Route] = []

    def add(
        self,
        method: str,
        pattern: str,
        handler: Handler,
        doc: str = "",
        request_schema: str | None = None,
        *,
        text_body: bool = False,
    ) -> None:
        self.routes.append(Route(method, re.compile(f"^{pattern}$"), handler, doc, request_schema, text_body))

    def match(self, method: str, path: str) -> tuple[Route | None, dict[str, str], bool]:
        path_known = False
        for r in self.routes:
            m = r.pattern.match(path)
            if m:
                path_known = True
                if r.method == method:
                    return r, {k: unquote(v) for k, v in m.groupdict().items()}, True
        return None, {}, path_known


def family_of(path: str) -> str:
    return "compute" if path.startswith("/compute/") else "tpu"


class LocalCloudServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a burst of clients on a loaded machine overflows it and the
    # kernel drops or resets their connections, which Google's front ends never do. uvicorn's default is 2048.
    request_queue_size = 1024

    def __init__(self, port: int, cloud: Cloud, router: Router, strict: bool) -> None:
        self.cloud = cloud
        self.router = router
        self.strict = strict
        self.violations: list[str] = cloud.violations  # shared: readable after stop and via admin
        super().__init__(("127.0.0.1", port), _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that disconnects mid-request (e.g. while the request line is read) is not an error."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("client %s disconnected: %r", client_address, exc)
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: LocalCloudServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _send(self, status: int, payload: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(body).encode(), "application/json; charset=UTF-8", headers)

    def _client_gone(self) -> bool:
        """True when the peer closed its end (EOF or reset pending); pipelined bytes do not count."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _dispatch(self, method: str) -> None:
        """Answer one request; a client that went away (killed long-poller) is dropped quietly."""
        try:
            self._answer(method)
        except ConnectionError as e:  # BrokenPipeError, ConnectionResetError, ConnectionAbortedError
            log.debug("client %s disconnected during %s %s: %r", self.client_address, method, self.path, e)
            self.close_connection = True

    def _answer(self, method: str) -> None:
        split = urlsplit(self.path)
        path = split.path
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        family = family_of(path)
        try:
            self._route_and_answer(method, path, query, raw)
        except ApiError as e:
            self._send_json(e.code, e.body(family))
        except ConnectionError:
            raise  # the client left: _dispatch drops it, it is no server bug
        except Exception as e:  # noqa: BLE001 - a server bug must reach the client as a 500
            log.error("localcloud internal error: %s", traceback.format_exc())
            self.server.violations.append(f"internal error: {e!r}")
            self._send_json(500, ApiError(500, f"Internal error: {e!r}").body(family))

    def _route_and_answer(self, method: str, path: str, query: dict[str, str], raw: bytes) -> None:
        """Injected fault, route, request check, handler, response check: Google's order of refusals."""
        fault = None
        if not path.startswith(("/_localcloud", "/_machines")):
            self.server.cloud.log_request(method, path)
            fault = self.server.cloud.take_fault(method, path)
        if fault is not None:
            raise injected_fault(fault.status, method, path, self.server.cloud.scenario.project)
        route, params, known = self.server.router.match(method, path)
        if route is None:
            raise ApiError(
                405 if known else 404, f"No such method: {method} {path}", "UNIMPLEMENTED" if known else "NOT_FOUND"
            )
        body = None if route.text_body else self._request_body(route, raw)
        int_enums = "enum-encoding=int" in query.get("$alt", "")
        req = Request(
            method, path, params, query, body, dict(self.headers.items()), int_enums, route.doc, self._client_gone, raw
        )
        selection = self._selection(query) if route.doc else None  # a malformed one is refused before acting
        resp = route.handler(req)
        if resp.raw is not None:
            self._send(resp.status, resp.raw, resp.headers.pop("Content-Type", "text/plain"), resp.headers)
            return
        out = resp.body
        if resp.schema and route.doc:
            self._check_response(route.doc, resp.schema, out)
            if int_enums:
                out = discovery.enums_to_numbers(route.doc, resp.schema, out)
            if selection is not None:
                try:
                    partial.check(route.doc, resp.schema, selection)
                except partial.FieldsError as e:
                    raise invalid(str(e)) from e
                out = partial.select(out, selection)
        self._send_json(resp.status, out, resp.headers)

    @staticmethod
    def _selection(query: dict[str, str]) -> partial.Selection | None:
        """The ``fields`` system parameter of a Google API call (interlude_localcloud.partial), or a 400."""
        if "fields" not in query:
            return None
        try:
            return partial.parse(query["fields"])
        except partial.FieldsError as e:
            raise invalid(str(e)) from e

    @staticmethod
    def _request_body(route: Any, raw: bytes) -> Any:
        """The parsed JSON body, checked against the method's request schema (enums as names)."""
        if not raw.strip():
            return None
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as e:
            raise invalid(f"Invalid JSON payload received. {e}") from e
        if route.request_schema:
            if not isinstance(body, dict):
                raise invalid("Invalid JSON payload received. Expected an object.")
            problems = discovery.validate(route.doc, route.request_schema, body, request=True)
            if problems:
                raise invalid("Invalid JSON payload received. " + "; ".join(problems[:3]))
            body = discovery.enums_to_names(route.doc, route.request_schema, body)
        return body

    def _check_response(self, doc: str, schema: str, out: Any) -> None:
        """Strict mode: an answer Google would never give is a local-cloud bug, reported as a 500."""
        if not self.server.strict:
            return
        problems = discovery.validate(doc, schema, out)
        if problems:
            msg = f"localcloud strict mode: {schema} response violates {doc}: " + "; ".join(problems[:5])
            self.server.violations.append(msg)
            raise ApiError(500, msg, "INTERNAL")


def serve(port: int, cloud: Cloud, router: Router, strict: bool) -> tuple[LocalCloudServer, threading.Thread]:
    """Start serving on 127.0.0.1:port (0 = any free port) in a daemon thread."""
    srv = LocalCloudServer(port, cloud, router, strict)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, name="localcloud-http", daemon=True)
    t.start()
    return srv, t
