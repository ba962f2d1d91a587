"""One cluster's Kubernetes API server: uvicorn over TLS on 127.0.0.1, in a thread of the local cloud."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path

import uvicorn

from interlude_localcloud.gke import pki
from interlude_localcloud.gke.config import ClusterSpec
from interlude_localcloud.gke.kube_api import KubeApi, RequestLog, build_app
from interlude_localcloud.gke.store import Store
from interlude_localcloud.gke.validation import Admission


class KubeApiServer:
    """Store + admission + HTTPS front for one cluster. `endpoint` is `127.0.0.1:port` like GKE's."""

    def __init__(self, spec: ClusterSpec, state_dir: Path) -> None:
        self.spec = spec
        self.admission = Admission(spec.minor_version)
        self.store = Store(self.admission, self.admission.check_update)
        self.tls = pki.issue(state_dir / "gke" / spec.name, spec.name)
        self.requests = RequestLog()  # every request the API server got (admin `.../requests`)
        self._sock: socket.socket | None = None
        self._port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._port = int(self._sock.getsockname()[1])
        self._sock.set_inheritable(False)
        app = build_app(KubeApi(self.store, self.admission, self.spec.kubernetes_version), self.endpoint, self.requests)
        config = uvicorn.Config(
            app,
            log_level="warning",
            ssl_certfile=str(self.tls.cert_file),
            ssl_keyfile=str(self.tls.key_file),
            timeout_graceful_shutdown=1,
            access_log=False,
            lifespan="off",
        )
        self._server = uvicorn.Server(config)
        sockets = [self._sock]
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=sockets)),  # type: ignore[union-attr]
            name=f"gke-apiserver-{self.spec.name}",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"Kubernetes API server for {self.spec.name} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._server is not None:
            # Open watches and idle keep-alive connections would hold a graceful shutdown: close them now.
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None
