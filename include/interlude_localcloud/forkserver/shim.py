"""The machine's ``python3``: ``-m interlude_workload.agent ...`` (or ``.train``) forked by the machine's root,
anything else the real interpreter.

The local cloud writes this file to the machine's PATH with a first line that runs it under the real interpreter
with ``-I -S`` (no site packages, nothing from the environment: a few milliseconds) and the two paths it needs
(:func:`interlude_localcloud.forkserver.client.write_shim`). It passes its own standard input, output and error and
its environment to the root, which forks the module's process in the machine's process group; this process waits
for it, forwards SIGTERM, SIGINT and SIGHUP to it (as the startup script forwards them to this pid), and ends as it
ended: the same exit code, or killed by the same signal.
"""

from __future__ import annotations

import os
import signal
import socket
import sys


def main(real: str, wire_dir: str) -> None:
    args = sys.argv[1:]
    sys.path.insert(0, wire_dir)
    import wire  # type: ignore[import-not-found]  # this folder's wire.py, by path (no site packages here)

    path = os.environ.get(wire.SOCKET_ENV, "")
    if path and wire.module_of(args):
        _forked(wire, path, args)  # returns only when the root says: run the real interpreter
    os.execv(real, [real, *args])


def _forked(wire: object, path: str, args: list[str]) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        wire.send(sock, {"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}, [0, 1, 2])  # type: ignore[attr-defined]
        reply, _ = wire.recv(sock)  # type: ignore[attr-defined]
    except (OSError, EOFError):
        sock.close()
        return  # no root to ask (a machine without one): the real interpreter
    if "pid" not in reply:
        sock.close()
        return
    pid = int(reply["pid"])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, forward)
    try:
        ended, _ = wire.recv(sock)  # type: ignore[attr-defined]
        code = int(ended["exit"])
    except (OSError, EOFError, KeyError, ValueError):
        code = -signal.SIGKILL  # the root is gone: so is the machine
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)
