"""The local cloud's side of the fork server: one zygote per local-cloud process, started at the first boot, and
a handle on each process it forks with the part of ``subprocess.Popen`` the machines and the kubelet use.

``INTERLUDE_LOCALCLOUD_FORKSERVER=0`` turns it off (every machine starts its interpreters as before): the
baseline of ``benchmarks/restore_probe.py``, and a way to tell the fork server apart from a workload's fault.
"""

from __future__ import annotations

import atexit
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from interlude_localcloud.forkserver import wire

ENABLE_ENV = "INTERLUDE_LOCALCLOUD_FORKSERVER"
SHARED_ENV = "INTERLUDE_LOCALCLOUD_ZYGOTE"  # a zygote's socket that the processes a test session starts share
# The zygote's start is bounded by its own CPU: its imports cost ~3 CPU-s whatever the load, while their wall time
# stretches many-fold under a full suite. The wall bound is for a zygote that is alive but gets nowhere.
START_CPU_SECONDS = 60.0
START_TIMEOUT = 1200.0


def _cpu_seconds(pid: int) -> float:
    """The process's own CPU time (user + system) from /proc; 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def enabled() -> bool:
    """Unless turned off (:data:`ENABLE_ENV`), wherever there is fork()."""
    return hasattr(os, "fork") and os.environ.get(ENABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


class Forked:
    """A process the zygote forked, told apart by its connection: the zygote writes its exit code there."""

    def __init__(self, conn: socket.socket, pid: int, stdout: int | None = None) -> None:
        self._conn = conn
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = os.fdopen(stdout, "rb") if stdout is not None else None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        return self._wait(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0.0)
        return code

    def _wait(self, timeout: float | None) -> int | None:
        """The exit code once the zygote has told it; waits up to ``timeout`` (None: for ever). The lock is held
        only to read, never while waiting: a poll() from another thread must not wait for a wait()."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
                    try:
                        message, _ = wire.recv(self._conn)
                        self.returncode = int(message["exit"])
                    except (OSError, EOFError, KeyError, ValueError):
                        self.returncode = -signal.SIGKILL  # the zygote is gone, and its children with it
                    self._conn.close()
                if self.returncode is not None:
                    return self.returncode
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                select.select([self._conn], [], [], 0.05 if left is None else min(left, 0.05))
            except (OSError, ValueError):
                pass  # closed by the reader in the other thread: the loop sees its code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The zygote (``python -m interlude_localcloud.forkserver.server``) and the way to reach it."""

    _shared: ForkServer | None = None
    _shared_failed = False
    _starting: threading.Thread | None = None
    _shared_lock = threading.Lock()

    def __init__(self, attach: str | None = None, wait: bool = True) -> None:
        """Start a zygote (``wait``: until it serves), or ``attach`` to one another process started and shared
        (its socket path: :data:`SHARED_ENV`)."""
        if attach:
            self.directory, self.socket_path, self.proc = Path(attach).parent, attach, None
            self.shim_dir = self.directory / "bin"
            return
        self.directory = Path(tempfile.mkdtemp(prefix="ilfs-"))  # 0700; a short path (AF_UNIX allows 107 bytes)
        self.socket_path = str(self.directory / "zygote.sock")
        self.shim_dir = self.directory / "bin"
        write_shims(self.shim_dir)
        log = (self.directory / "zygote.log").open("ab")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "interlude_localcloud.forkserver.server", self.socket_path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while wait and not self.ready():
            cpu = _cpu_seconds(self.proc.pid)
            if self.proc.poll() is not None or cpu > START_CPU_SECONDS or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"fork server did not start ({cpu:.0f} CPU-s of its own): {self.log_tail()}")
            time.sleep(0.02)

    def ready(self) -> bool:
        return os.path.exists(self.socket_path)

    def alive(self) -> bool:
        return self.proc.poll() is None if self.proc is not None else self.ready()

    @classmethod
    def share(cls) -> ForkServer:
        """Start a zygote for this process and every process it starts (a test session: each local cloud it
        starts attaches to it instead of importing the workload in a zygote of its own). Not waited for: until it
        serves, machines start their interpreters."""
        server = ForkServer(wait=False)
        os.environ[SHARED_ENV] = server.socket_path
        with cls._shared_lock:
            cls._shared = server
        return server

    @classmethod
    def shared(cls) -> ForkServer | None:
        """This process's zygote once it is ready, else None (machines then start their interpreters as before):
        turned off, no fork, still importing (its start is begun here, in a thread: a boot never waits for it),
        or it failed to start. A zygote shared by the process that started this one (:data:`SHARED_ENV`) is used
        when it serves."""
        if not enabled():
            return None
        with cls._shared_lock:
            attach = os.environ.get(SHARED_ENV, "")
            if attach and (cls._shared is None or cls._shared.socket_path != attach):
                cls._shared = ForkServer(attach=attach)
            if cls._shared is not None and not cls._shared.alive():
                if cls._shared.proc is None:  # a shared zygote not (yet, or any more) serving: start cold
                    return None
                cls._shared.close()  # ours died: start another
                cls._shared, cls._starting = None, None
            if cls._shared is None and cls._starting is None and not cls._shared_failed:
                cls._starting = threading.Thread(target=cls._start_shared, name="localcloud-forkserver", daemon=True)
                cls._starting.start()
            return cls._shared if cls._shared is not None and cls._shared.ready() else None

    @classmethod
    def wait_shared(cls, timeout: float = START_TIMEOUT) -> ForkServer | None:
        """The zygote once it is ready (for a test that must boot forked machines), None if it cannot be."""
        deadline = time.monotonic() + timeout
        while (server := cls.shared()) is None and time.monotonic() < deadline:
            if cls._shared_failed or not enabled():
                break
            time.sleep(0.05)
        return server

    @classmethod
    def _start_shared(cls) -> None:
        try:
            server = ForkServer()
        except (OSError, RuntimeError) as exc:
            print(f"localcloud: no fork server ({exc}); machines start their interpreters", file=sys.stderr)
            with cls._shared_lock:
                cls._shared_failed, cls._starting = True, None
            return
        atexit.register(server.close)
        with cls._shared_lock:
            cls._shared, cls._starting = server, None

    def log_tail(self) -> str:
        try:
            return (self.directory / "zygote.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def _request(self, message: Mapping[str, object], fds: Sequence[int]) -> tuple[socket.socket, dict[str, object]]:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.socket_path)
            wire.send(conn, message, fds)
            reply, _ = wire.recv(conn)
        except BaseException:
            conn.close()
            raise
        return conn, reply

    def machine(self, script: str, cwd: str, env: Mapping[str, str], log_fd: int) -> Forked:
        """Boot a machine: its root runs ``bash script`` in ``cwd`` with ``env`` (the shims first on PATH), output
        to ``log_fd``, in a session and process group of its own (the root's pid is the group's id)."""
        env = {**env, "PATH": f"{self.shim_dir}{os.pathsep}{env.get('PATH', '')}"}
        conn, reply = self._request({"kind": "machine", "script": script, "cwd": cwd, "env": dict(env)}, [log_fd])
        return Forked(conn, int(str(reply["pid"])))

    def module(self, argv: Sequence[str], cwd: str, env: Mapping[str, str]) -> Forked | None:
        """``python ARGV`` (``-m MODULE ...``) as a process in a session of its own, its output on a pipe
        (``.stdout``); None when the zygote says the real interpreter must run it."""
        if not wire.module_of(argv):
            return None
        read, write = os.pipe()
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            try:
                conn, reply = self._request({"argv": list(argv), "cwd": cwd, "env": dict(env)}, [null, write, write])
            finally:
                os.close(null)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        if "pid" not in reply:
            conn.close()
            os.close(read)
            return None
        return Forked(conn, int(str(reply["pid"])), stdout=read)

    def close(self) -> None:
        if self.proc is None:
            return  # attached: its owner stops it
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def write_shims(directory: Path) -> None:
    """``python3`` and ``python`` that fork what they can (:mod:`.shim`), for a machine's PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    here = Path(__file__).resolve().parent
    body = (
        f"#!{sys.executable} -IS\n"
        "import sys\n"
        f"sys.path.insert(0, {str(here)!r})\n"
        "import shim\n"
        f"shim.main({sys.executable!r}, {str(here)!r})\n"
    )
    for name in ("python3", "python"):
        path = directory / name
        path.write_text(body)
        path.chmod(0o755)
