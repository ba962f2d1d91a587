"""A Service as a loopback TCP port that balances connections round robin over its Ready endpoints
(what kube-proxy does for a ClusterIP: https://kubernetes.io/docs/reference/networking/virtual-ips/)."""

from __future__ import annotations

import itertools
import socket
import threading


class ServiceProxy:
    def __init__(self, name: str) -> None:
        self.name = name
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = int(self._sock.getsockname()[1])
        self._backends: list[int] = []
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"svc-{name}", daemon=True).start()

    def set_backends(self, ports: list[int]) -> None:
        with self._lock:
            self._backends = sorted(ports)

    @property
    def backends(self) -> list[int]:
        with self._lock:
            return list(self._backends)

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _pick(self) -> int | None:
        with self._lock:
            if not self._backends:
                return None
            return self._backends[next(self._next) % len(self._backends)]

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        port = self._pick()
        if port is None:  # no ready endpoint: refuse, as a ClusterIP without endpoints does
            client.close()
            return
        try:
            upstream = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join(timeout=600)
        upstream.close()
        client.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
