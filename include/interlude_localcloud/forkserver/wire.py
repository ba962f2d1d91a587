"""The fork server's messages: a length-prefixed JSON object, with file descriptors passed alongside (SCM_RIGHTS).

Standard library only: the machine's ``python3`` (:mod:`.shim`) imports this file by path, with no site packages,
so that asking for a fork costs a few milliseconds, not an interpreter's start-up.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

HEADER = struct.Struct("!I")
MAX_FDS = 3
SOCKET_ENV = "INTERLUDE_FORKSERVER"  # the machine's socket, in its startup script's environment
# The modules a fork may run: what the zygote imported. Anything else runs the real interpreter.
MODULES = ("interlude_workload.agent", "interlude_workload.train")
# Variables that change what an import does (JAX's and XLA's settings, the interpreter's own, the libraries' thread
# pools, fsspec's and google-cloud-storage's import-time switches): a request whose values differ from the zygote's
# gets the real interpreter, which imports under them.
IMPORT_TIME_ENV = re.compile(
    r"^(JAX_|XLA_|TF_|PYTHON|LD_|OMP_|OPENBLAS|MKL_|GRPC_|TENSORSTORE|ABSL_|CUDA|NVIDIA_|TPU_|FSSPEC_|ENABLE_GCS_|GCP_STORAGE_)"
)


def send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    body = json.dumps(message).encode()
    socket.send_fds(sock, [HEADER.pack(len(body))], list(fds))
    sock.sendall(body)


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors that came with it (the caller owns them); EOFError when the peer is gone."""
    head, fds, _flags, _addr = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    try:
        head += _exactly(sock, HEADER.size - len(head)) if head else b""
        if not head:
            raise EOFError("fork server connection closed")
        (size,) = HEADER.unpack(head)
        return json.loads(_exactly(sock, size)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("fork server connection closed mid-message")
        data += chunk
    return data


def module_of(argv: Sequence[str]) -> str | None:
    """``-m MODULE ...`` with a module a fork may run: that module, else None."""
    return argv[1] if len(argv) >= 2 and argv[0] == "-m" and argv[1] in MODULES else None
