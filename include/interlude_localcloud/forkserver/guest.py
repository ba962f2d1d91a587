"""What runs in a fork of the zygote: a machine's root (its startup script and the forks it asks for), and a
module's process (``python -m MODULE`` without a new interpreter).

Both start from a process that imported the workload once (:mod:`.server`) and are made to look like a fresh
interpreter started the way the machine would have started it: the default signal dispositions and mask, the
requested standard streams, working directory and environment, ``sys.argv`` and ``sys.path[0]`` as ``-m`` sets
them. Only what the imports did stays, and :func:`compatible` refuses a request whose environment would have made
those imports differ.
"""

from __future__ import annotations

import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from interlude_localcloud.forkserver import wire

STOPS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


@dataclass(frozen=True)
class Imports:
    """The zygote's environment before and after it imported the workload (an import may set a variable, as
    interlude_workload.model sets XLA_FLAGS), and what the workload derives again from each process's own
    environment (``derived``: the GCS emulator's settings, re-made by ``refresh`` in every fork)."""

    before: Mapping[str, str]
    after: Mapping[str, str]
    derived: frozenset[str] = frozenset()
    refresh: Callable[[], object] | None = None

    def compatible(self, env: Mapping[str, str]) -> bool:
        """Whether the imports would have been the same under ``env``: a machine of the local cloud (its GCS the
        emulator: the zygote imported as such a machine's interpreter does), and every other import-time variable
        as it was before the zygote's imports, or as they left it."""
        if not env.get(EMULATOR_ENV):
            return False
        names = {n for n in (*env, *self.before, *self.after) if wire.IMPORT_TIME_ENV.match(n)} - self.derived
        return all(env.get(n) in (self.before.get(n), self.after.get(n)) for n in names)

    def environ(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with what the imports set (where ``env`` still has the value from before them)."""
        out = dict(env)
        for name in (set(self.before) | set(self.after)) - self.derived:
            if self.before.get(name) != self.after.get(name) and out.get(name) == self.before.get(name):
                if name in self.after:
                    out[name] = self.after[name]
                else:
                    out.pop(name, None)
        return out


def fork_blocked() -> int:
    """fork() with SIGTERM, SIGINT and SIGHUP blocked across it: one sent in between reaches the child after it
    has the default handlers (a new process's), never the parent's handler in the child."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    return pid


def become(fds: Sequence[int], cwd: str, env: Mapping[str, str]) -> None:
    """In a fresh fork: the default signal handling, ``fds`` as standard input, output and error (fewer: the
    rest /dev/null), the working directory and exactly ``env`` as the environment."""
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    streams = list(fds)
    while len(streams) < 3:
        streams.append(os.open(os.devnull, os.O_RDWR))
    for target, fd in enumerate(streams[:3]):
        os.dup2(fd, target)
    # Nothing else: a new interpreter inherits no other descriptor (the servers' sockets, pidfds, the other
    # machines' connections stay with them). Their Python objects are on this process's stack until os._exit.
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def name_process(name: str) -> None:
    """The process's name as ps and /proc/PID/stat show it (its command line stays the zygote's): ``il-agent``,
    ``il-train``, ``il-root``, ``il-zygote`` (benchmarks/suite_cpu.py counts the CPU by it)."""
    try:
        Path("/proc/self/comm").write_text(name[:15])
    except OSError:
        pass


def run_module(argv: Sequence[str]) -> NoReturn:
    """``python -m MODULE ARGS`` in this process (``argv`` = ``["-m", MODULE, *ARGS]``), then exit with its code."""
    code = 1
    name_process("il-" + argv[1].rsplit(".", 1)[-1])
    try:
        sys.argv = ["-m", *argv[2:]]  # what -m shows the module until runpy puts its file in argv[0]
        sys.path[0] = os.getcwd()  # -m puts the working directory first
        # A new interpreter has not imported the module it runs: run it as __main__ only (the zygote's copy would
        # otherwise be a second one, and runpy warns so); whatever imports it by name later imports it again.
        sys.modules.pop(argv[1], None)
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the process ends here whatever happened, the traceback said
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def exit_like(code: int) -> NoReturn:
    """End as a process that ended with ``code`` (negative: killed by that signal)."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-code})
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


class Children:
    """Forked children, each with the connection to tell its exit code to (pidfds in a select loop)."""

    def __init__(self) -> None:
        self.by_fd: dict[int, tuple[int, socket.socket]] = {}

    def add(self, pid: int, conn: socket.socket) -> None:
        self.by_fd[os.pidfd_open(pid)] = (pid, conn)

    def reap(self, fd: int) -> int:
        pid, conn = self.by_fd.pop(fd)
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        try:
            wire.send(conn, {"exit": code})
        except OSError:
            pass  # nobody is waiting any more
        conn.close()
        return code


def machine_root(request: Mapping[str, Any], log_fd: int, imports: Imports, listen_path: str) -> NoReturn:
    """A machine's root: a session and process group of its own, the serial log as output, the startup script
    under bash, and a socket where the machine's ``python3`` asks for forks. Ends as the script ends."""
    os.setsid()
    name_process("il-root")
    become([os.open(os.devnull, os.O_RDONLY), log_fd, os.dup(log_fd)], request["cwd"], imports.environ(request["env"]))
    for signum in STOPS:  # the machine's SIGTERM is for the script and the workload; the root waits for them
        signal.signal(signum, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(listen_path)
    os.chmod(listen_path, 0o600)
    listener.listen(8)
    env = {**os.environ, wire.SOCKET_ENV: listen_path}
    code = 1
    try:
        script = subprocess.Popen(["bash", request["script"]], env=env, stdin=subprocess.DEVNULL)
        code = _serve_machine(listener, script, imports)
    finally:
        listener.close()
        try:
            os.unlink(listen_path)
        except OSError:
            pass
    exit_like(code)


def _serve_machine(listener: socket.socket, script: subprocess.Popen[bytes], imports: Imports) -> int:
    children = Children()
    script_fd = os.pidfd_open(script.pid)
    while True:
        ready, _, _ = select.select([listener, script_fd, *children.by_fd], [], [])
        for fd in ready:
            if fd is listener:
                conn, _ = listener.accept()
                try:
                    request, fds = wire.recv(conn)
                except (OSError, EOFError, ValueError):
                    conn.close()
                    continue
                fork_module(conn, request, fds, imports, children, new_session=False)
            elif fd == script_fd:
                return script.wait()
            else:
                children.reap(fd)


def fork_module(
    conn: socket.socket,
    request: Mapping[str, Any],
    fds: Sequence[int],
    imports: Imports,
    children: Children,
    new_session: bool,
) -> None:
    """Answer one request for ``python -m MODULE``: fork it (``{"pid": N}``, later ``{"exit": CODE}``) or say
    that the real interpreter must run it (``{"exec": true}``)."""
    argv, env = list(request.get("argv") or []), dict(request.get("env") or {})
    if not wire.module_of(argv) or not imports.compatible(env):
        for fd in fds:
            os.close(fd)
        _reply(conn, {"exec": True})
        conn.close()
        return
    pid = fork_blocked()
    if pid == 0:  # pragma: no cover - the child ends in os._exit (the machines' tests see its work)
        conn.close()
        if new_session:
            os.setsid()
        become(fds, str(request.get("cwd") or "/"), imports.environ(env))
        if imports.refresh is not None:
            imports.refresh()  # the emulator's endpoint is this machine's, not the zygote's placeholder
        run_module(argv)
    for fd in fds:
        os.close(fd)
    _reply(conn, {"pid": pid})
    children.add(pid, conn)  # reaped in any case; its exit is told to whoever still listens


def _reply(conn: socket.socket, message: Mapping[str, Any]) -> bool:
    try:
        wire.send(conn, message)
        return True
    except OSError:
        return False
