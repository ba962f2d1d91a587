"""A warm `airflow` CLI for development runs: Airflow imported once, a forked child per command.

Why: an `airflow dags test` pays ~14-16 CPU-s on the 2-core machine even when its DAG only plans, and most of
it is the same work every time: importing Airflow and its CLI and building the in-process Execution API, whose
Cadwyn app generates a router per API version on its first request (~3 CPU-s). The suite runs ~50 of them.
A server (interlude_dev.warm_server) does that work once, then forks a child per command; the child is a real
process (its own pid and session, killable, reaped by the server) that runs Airflow's own CLI entry point
(`airflow.__main__.main`) with the caller's argv, environment, working directory and log file.

Used when $INTERLUDE_WARM_AIRFLOW is 1 (tests/conftest.py sets it for the suite): `start_airflow` then uses the
server named in $INTERLUDE_WARM_SOCKET (the suite's xdist controller shares one for the whole run, `share_server`),
else starts one for the calling process on first use. Otherwise it starts a new `airflow` process: the same command
either way.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from interlude_dev.warm_server import kill_group

SWITCH_ENV = "INTERLUDE_WARM_AIRFLOW"
# The socket of the warm server this process started, for the processes it starts (a benchmark or demo a test
# runs): they send their commands there rather than warm up a server of their own (~8-10 CPU-s each).
SOCKET_ENV = "INTERLUDE_WARM_SOCKET"
_AIRFLOW = str(Path(sys.executable).parent / "airflow")
PID_FILE = "server.pid"
# How long a server may take to listen, in its own CPU time: a cold start (Airflow's imports, the DAG bag) costs a
# few CPU-seconds, whatever the load; under load its wall time stretches many-fold (a fixed 180 wall seconds
# failed at load 15-20, the server still importing). The wall bound is for a server that is alive but gets nowhere
# (blocked, no CPU spent).
STARTUP_CPU_SECONDS = 120.0
STARTUP_SECONDS = 1200.0


def _cpu_seconds(pid: int) -> float:
    """The process's own CPU time (user + system), from /proc; 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WarmProcess:
    """A command run by a warm server: a pid, `poll()`, `wait(timeout)` and `kill()`, like `subprocess.Popen`."""

    # CPU of every warm child this process saw finish: the kernel's count, which getrusage(RUSAGE_CHILDREN) here
    # cannot see (the server reaps them). benchmarks/suite_cpu.py --by-test adds it to each test's own.
    finished_cpu_seconds = 0.0

    def __init__(self, path: str, request: Mapping[str, Any]):
        # The log exists (empty) once this returns, as with a Popen writing to a file the caller opened.
        with open(request["log"], "w"):
            pass
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._sock.sendall(json.dumps(request).encode() + b"\n")
        self._buffer = b""
        first = self._line(None)
        if first is None:
            raise RuntimeError("the warm Airflow server went away")
        self.pid = int(first["pid"])
        self.returncode: int | None = None
        self.cpu_seconds: float | None = None

    def _line(self, timeout: float | None) -> dict[str, Any] | None:
        """The server's next message; None if it hung up. TimeoutError when none came within timeout."""
        self._sock.settimeout(timeout)
        while b"\n" not in self._buffer:
            data = self._sock.recv(4096)
            if not data:
                return None
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return dict(json.loads(line))

    def _finish(self, timeout: float | None) -> None:
        message = self._line(timeout)
        if message is None:
            raise RuntimeError("the warm Airflow server went away")
        self.returncode = int(message["rc"])
        self.cpu_seconds = float(message["cpu"])  # the kernel's count for the child (user + system), at its exit
        WarmProcess.finished_cpu_seconds += self.cpu_seconds
        self._sock.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self._finish(0)
            except (TimeoutError, BlockingIOError):
                return None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self._finish(timeout)
            except TimeoutError:
                raise subprocess.TimeoutExpired(["airflow"], timeout or 0) from None
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        kill_group(self.pid)


class WarmServer:
    """One warm server for this process: started on first use, stopped by `stop()` or at exit.

    Its Airflow home is a new private directory with no airflow.cfg, as every per-run home starts.
    """

    def __init__(self, env: Mapping[str, str], wait: bool = True):
        self.dir = Path(tempfile.mkdtemp(prefix="interlude-warm-"))
        self.path = str(self.dir / "sock")
        (self.dir / "home").mkdir()
        server_env = {**env, "AIRFLOW_HOME": str(self.dir / "home")}
        with open(self.dir / "server.log", "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "interlude_dev.warm_server", self.path],
                env=server_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        # Beside the socket, for the processes that inherit its name before it listens (_wait_while_starting).
        (self.dir / PID_FILE).write_text(str(self.proc.pid))
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Return once the server listens; stop it and raise if it exits, spends over STARTUP_CPU_SECONDS of its
        own CPU, or takes over STARTUP_SECONDS."""
        deadline = time.monotonic() + STARTUP_SECONDS
        while not os.path.exists(self.path):
            cpu = _cpu_seconds(self.proc.pid)
            if self.proc.poll() is not None or cpu > STARTUP_CPU_SECONDS or time.monotonic() > deadline:
                code = self.proc.poll()
                log = (self.dir / "server.log").read_text(errors="replace")[-3000:]  # stop() removes the directory
                self.stop()
                why = (
                    f"exited {code}"
                    if code is not None
                    else f"not listening after {cpu:.0f} CPU-s of its own, "
                    f"{STARTUP_SECONDS - (deadline - time.monotonic()):.0f} s"
                )
                raise RuntimeError(
                    f"the warm Airflow server did not start ({why}; server pid {self.proc.pid}); its log ends:\n{log}"
                )
            time.sleep(0.05)

    def start(self, request: Mapping[str, Any]) -> WarmProcess:
        return WarmProcess(self.path, request)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


_SERVER: WarmServer | None = None


def enabled() -> bool:
    """$INTERLUDE_WARM_AIRFLOW=1 (the test suite sets it): Airflow commands go through a warm server."""
    return os.environ.get(SWITCH_ENV) == "1"


def server(env: Mapping[str, str]) -> WarmServer:
    """This process's warm server, started on first use; its socket is named in SOCKET_ENV for the processes
    this one starts."""
    global _SERVER
    if _SERVER is None or _SERVER.proc.poll() is not None:
        _SERVER = WarmServer(env)
        os.environ[SOCKET_ENV] = _SERVER.path
    _SERVER.wait_ready()  # one that share_server started may still be warming up
    return _SERVER


def share_server(env: Mapping[str, str]) -> WarmServer:
    """Start this process's warm server without waiting for it, and name it in SOCKET_ENV for the processes
    started from now on, which use it rather than a server each.

    The test suite's xdist controller calls it before its workers start (tests/conftest.py): one warm-up for
    the whole run, done while the workers collect, instead of one per worker (~7 CPU-s each). A process that
    asks for a child before the server listens waits for it (_wait_while_starting).
    """
    global _SERVER
    if _SERVER is None or _SERVER.proc.poll() is not None:
        _SERVER = WarmServer(env, wait=False)
        os.environ[SOCKET_ENV] = _SERVER.path
    return _SERVER


def _wait_while_starting(path: str) -> None:
    """Wait while the server named by ``path`` is alive but not yet listening (its starter did not wait for
    it); return at once when it listens, is gone or was never there, or after STARTUP_SECONDS."""
    try:
        pid = int((Path(path).parent / PID_FILE).read_text())
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + STARTUP_SECONDS
    while not os.path.exists(path) and time.monotonic() < deadline:
        try:  # that pid still the server (not gone, not a new process that got its number)
            if b"interlude_dev.warm_server" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                return
        except OSError:
            return
        time.sleep(0.05)


def _start_warm(request: Mapping[str, Any], env: Mapping[str, str]) -> WarmProcess:
    """Through the server an ancestor named in SOCKET_ENV while it answers (waiting for it while it starts),
    else through this process's own."""
    inherited = os.environ.get(SOCKET_ENV)
    if _SERVER is None and inherited:
        _wait_while_starting(inherited)
        try:
            return WarmProcess(inherited, request)
        except OSError:  # gone (its starter exited): this process warms up its own
            pass
    return server(env).start(request)


@atexit.register
def stop_server() -> None:
    global _SERVER
    if _SERVER is not None:
        _SERVER.stop()
        _SERVER = None


def start_airflow(
    argv: Sequence[str], env: Mapping[str, str], log: Path, python_c: str | None = None
) -> WarmProcess | subprocess.Popen[bytes]:
    """Start `airflow <argv>` (or `python -c python_c <argv>`) with env, output to log: through this process's
    warm server when enabled(), else as a new process. Either has pid, poll(), wait(timeout) and kill()."""
    if not enabled():
        cmd = [sys.executable, "-c", python_c, *argv] if python_c else [_AIRFLOW, *argv]
        with open(log, "w") as out:
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "log": str(log), "python_c": python_c}
    return _start_warm(request, env)


def run_airflow(
    argv: Sequence[str], env: Mapping[str, str], log: Path, timeout: float | None, python_c: str | None = None
) -> int:
    """start_airflow, then its exit code; after timeout it is killed and subprocess.TimeoutExpired raised, as
    `subprocess.run` does."""
    proc = start_airflow(argv, env, log, python_c)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def airflow_output(argv: Sequence[str], env: Mapping[str, str], timeout: float | None = 300) -> tuple[int, str]:
    """`airflow <argv>` as run_airflow runs it; its exit code and its output (stdout and stderr together)."""
    with tempfile.TemporaryDirectory(prefix="interlude-cli-") as tmp:
        log = Path(tmp) / "out.log"
        code = run_airflow(argv, env, log, timeout)
        return code, log.read_text(errors="replace")


def check_airflow(
    argv: Sequence[str], env: Mapping[str, str], append_to: Path | None = None, timeout: float | None = 300
) -> None:
    """`airflow <argv>` as airflow_output runs it, its output appended to ``append_to`` (when given);
    subprocess.CalledProcessError (with the output) when it fails, as `subprocess.run(check=True)` raises."""
    code, output = airflow_output(argv, env, timeout)
    if append_to is not None:
        with open(append_to, "a") as out:
            out.write(output)
    if code != 0:
        raise subprocess.CalledProcessError(code, ["airflow", *argv], output)
