"""The zygote: imports the workload once, then forks machines' roots and modules' processes on request.

Run by :mod:`.client` as ``python -m interlude_localcloud.forkserver.server SOCKET``; it serves on the Unix
socket ``SOCKET`` (mode 0600, in a 0700 directory: only this user's processes reach it, and it checks their uid)
until its parent, the local cloud, is gone or closes it. Single-threaded by design: a fork copies one thread, so a
lock another thread held would stay held in every machine forever (see interlude_workload.warm). It refuses to
start when its imports left a thread behind.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
from typing import Any

from interlude_localcloud.forkserver import guest, wire


def preload() -> guest.Imports:
    """Import what a machine's agent and its trainers import (the agent's own preload): once, here, as a local
    cloud machine's interpreter imports it, with a GCS emulator. That matters at import time: the workload points
    gcsfs and google-auth at an emulator before they read their environment (orbax_env: gcsfs picks its file
    system class on import). The endpoint itself is a placeholder here; each fork derives the settings again from
    its own (``refresh``), as the workload does whenever the endpoint moves."""
    before = dict(os.environ)
    from interlude_workload import orbax_env

    os.environ.setdefault(guest.EMULATOR_ENV, f"http://{orbax_env.CLOSED_LOOPBACK}")
    from interlude_workload import agent, warm

    del agent
    warm.preload()
    if not warm.can_fork():
        raise SystemExit("fork server: the workload's imports started a thread; forking would not be safe")
    derived = frozenset(orbax_env.environment_for("http://placeholder")) | {guest.EMULATOR_ENV}
    after = dict(os.environ)
    return guest.Imports(before=before, after=after, derived=derived, refresh=orbax_env.configure_for_emulator)


def same_user(conn: socket.socket) -> bool:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid == os.getuid()


def serve(path: str) -> None:
    guest.name_process("il-zygote")
    imports = preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    parent = os.getppid()
    children = guest.Children()
    print(f"fork server: ready on {path}", flush=True)
    while os.getppid() == parent:
        ready, _, _ = select.select([listener, *children.by_fd], [], [], 1.0)
        for fd in ready:
            if fd is listener:
                conn, _ = listener.accept()
                if same_user(conn):
                    _serve(conn, imports, children, os.path.dirname(path))
                else:
                    conn.close()
            else:
                children.reap(fd)


def _serve(conn: socket.socket, imports: guest.Imports, children: guest.Children, directory: str) -> None:
    try:
        request, fds = wire.recv(conn)
    except (OSError, EOFError, ValueError):
        conn.close()
        return
    if request.get("kind") == "machine":
        _machine(conn, request, fds, imports, children, directory)
    else:  # a module's process in a session of its own (a GKE container's command)
        guest.fork_module(conn, request, fds, imports, children, new_session=True)


def _machine(
    conn: socket.socket,
    request: dict[str, Any],
    fds: list[int],
    imports: guest.Imports,
    children: guest.Children,
    directory: str,
) -> None:
    (log_fd,) = fds
    pid = guest.fork_blocked()
    if pid == 0:  # pragma: no cover - the child ends in os._exit
        conn.close()
        guest.machine_root(request, log_fd, imports, os.path.join(directory, f"m{os.getpid()}.sock"))
    os.close(log_fd)
    try:
        wire.send(conn, {"pid": pid})
    except OSError:
        pass
    children.add(pid, conn)


if __name__ == "__main__":
    serve(sys.argv[1])
