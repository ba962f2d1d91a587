"""The warm Airflow server behind interlude_dev.warm_cli: Airflow imported once, a forked child per command.

What a child gets, so that it behaves as a fresh `airflow` process would:
- the caller's environment, exactly (os.environ is replaced) and its working directory;
- stdin from /dev/null, stdout and stderr to the caller's log file;
- Airflow's configuration rebuilt from that environment (`_reconfigure_airflow`): AIRFLOW_HOME and the
  defaults expanded from it (the metadata DB, the log folders), the home's airflow.cfg, the ORM (the server
  never opens the DB). `conf` reads the environment on each read, so per-run `AIRFLOW__...` variables apply.
The server imports only Airflow itself and third-party libraries (WARM_MODULES), never Interlude's DAGs or
operators, which read their settings when the child parses the DAG.

Protocol (one Unix socket, mode 0600, in a private directory): a client sends one JSON line
`{"argv", "env", "cwd", "log", "python_c"}`, the server answers `{"pid": N}` once the child runs and
`{"rc": N, "cpu": seconds}` when it exits (rc -signal when killed; cpu its user + system time, the kernel's count).
A client that hangs up early has its child's process group killed. The server exits on SIGTERM or when the
process that started it is gone.

    python -m interlude_dev.warm_server SOCKET_PATH
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import selectors
import signal
import socket
import sys
import threading
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What every `airflow dags test` imports, read off a profile of one: Airflow, its CLI and task runner, what it
# imports on its way to the DB (alembic), the clients Interlude's hooks use and the Google provider's base hook
# module (no operator module: those read `[operators]` settings into their defaults at import).
WARM_MODULES = (
    "airflow.__main__",
    "airflow.cli.commands.dag_command",
    "airflow.sdk.execution_time.task_runner",
    "alembic.autogenerate",
    "alembic.runtime.migration",
    "google.cloud.storage",
    "google.cloud.tpu_v2",
    "airflow.providers.google.common.hooks.base_google",
    "numpy",  # the workload's data module, imported by the training DAG's first task
)


def warm_up() -> None:
    """Import what every `airflow` command pays for, and build the in-process Execution API's routes.

    Nothing here connects to the metadata DB or starts a thread: a fork copies one thread only.
    """
    import importlib

    for name in WARM_MODULES:
        importlib.import_module(name)
    from airflow._shared.observability.metrics.stats import _get_registry
    from airflow.sdk.execution_time.supervisor import in_process_api_server

    _get_registry()  # the metric names, read from Airflow's YAML on the first metric of each process

    # SQLAlchemy configures the ORM's mappers (relationships, join conditions) on the first query of each
    # process (py-spy: 14 % of a warm `dags test`'s samples; a warm plan-only run 2.89 -> 2.65 CPU-s without it).
    # It depends on the model classes only, not on the database or the configuration: done once here, with
    # every model imported first.
    from airflow.models import import_all_models
    from sqlalchemy.orm import configure_mappers

    import_all_models()
    configure_mappers()

    app = in_process_api_server().app
    app._cadwyn_initialize()  # what its first request does: a router per Execution API version
    if threading.active_count() != 1:
        raise RuntimeError(f"warming up started threads: {threading.enumerate()}")


def _reconfigure_airflow() -> None:
    """Airflow's configuration again, from this environment, as `import airflow` made it in the server.

    Both parsers (core's and the Task SDK's) are rebuilt in place, since modules hold them by name: their
    defaults are expanded from AIRFLOW_HOME (the metadata DB, the log folders) and a home's airflow.cfg is read
    if it has one. `main()` then writes a missing airflow.cfg with new keys, as a new process does. Then the
    settings made from them: folders, sys.path, the ORM (the server never opened the DB). Logging keeps the
    server's set-up: the same for every caller (to stdout, here the caller's log).
    """
    import airflow.configuration as core
    import airflow.sdk.configuration as sdk
    from airflow import settings

    core.AIRFLOW_HOME = settings.AIRFLOW_HOME = core.get_airflow_home()
    core.AIRFLOW_CONFIG = core.get_airflow_config(core.AIRFLOW_HOME)
    core.SECRET_KEY = b64encode(os.urandom(16)).decode("utf-8")  # per process, as at import
    vars(core.conf).clear()
    vars(core.conf).update(vars(core.initialize_config()))
    core.secrets_backend_list = core.initialize_secrets_backends()
    core.conf.validate()
    if "conf" in vars(sdk):  # made lazily; a later first use makes it from this environment anyway
        vars(sdk.conf).clear()
        vars(sdk.conf).update(vars(sdk.initialize_config()))
    settings.configure_vars()
    settings.prepare_syspath_for_config_and_plugins()
    settings.configure_orm()


def _child(request: Mapping[str, Any]) -> None:
    """Runs in the forked child: become the caller's `airflow` process and exit with its code."""
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT, 0o644)  # the caller made it empty
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(request["cwd"])
        env = dict(request["env"])
        from setproctitle import setproctitle  # Airflow's own dependency: `ps` shows the command, not the server

        program = f"{sys.executable} -c" if request.get("python_c") else "airflow"
        setproctitle(" ".join([program, *request["argv"]]))  # before the environment changes: it moves it
        os.environ.clear()
        os.environ.update(env)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _reconfigure_airflow()
        try:
            if request.get("python_c"):
                sys.argv = ["-c", *request["argv"]]
                exec(compile(request["python_c"], "<string>", "exec"), {"__name__": "__main__"})
            else:
                from airflow.__main__ import main

                sys.argv = ["airflow", *request["argv"]]
                main()
            code = 0
        except SystemExit as exit_:  # as the interpreter does: None is 0, a message is printed and is 1
            if exit_.code is not None and not isinstance(exit_.code, int):
                print(exit_.code, file=sys.stderr)
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - anything: print it to the caller's log, exit non-zero
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()  # Airflow's own (the ORM's dispose, which checkpoints SQLite's WAL)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


@dataclass
class _Running:
    """One client connection and, once its request arrived, the child running it."""

    conn: socket.socket
    pid: int = 0
    buffer: bytes = b""


class _Server:
    """The server's loop state: a listener, the open connections, the children by pid. Single-threaded."""

    def __init__(self, listener: socket.socket):
        self.listener = listener
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ)
        self.by_conn: dict[socket.socket, _Running] = {}
        self.by_pid: dict[int, _Running] = {}
        # A child's exit wakes the loop (SIGCHLD through Python's wakeup fd): it sleeps, not polls, between.
        self.wakeup, self._wakeup_w = socket.socketpair()
        for end in (self.wakeup, self._wakeup_w):
            end.setblocking(False)
        signal.set_wakeup_fd(self._wakeup_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.wakeup, selectors.EVENT_READ)

    def step(self, timeout: float) -> None:
        for key, _ in self.sel.select(timeout=timeout):
            if key.fileobj is self.wakeup:
                while True:
                    try:
                        self.wakeup.recv(4096)
                    except BlockingIOError:
                        break
            elif key.fileobj is self.listener:
                conn, _addr = self.listener.accept()
                self.by_conn[conn] = _Running(conn)
                self.sel.register(conn, selectors.EVENT_READ)
            else:
                self._read(self.by_conn[key.fileobj])  # type: ignore[index]
        self._reap()

    def _read(self, running: _Running) -> None:
        data = running.conn.recv(1 << 20)
        if not data:  # the caller hung up: its child goes too
            self._close(running)
            if running.pid:
                kill_group(running.pid)
            return
        running.buffer += data
        if running.pid or b"\n" not in running.buffer:
            return
        request = json.loads(running.buffer.split(b"\n", 1)[0])
        sys.stdout.flush()  # nothing of the server's buffered output may reach the child's log
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for end in (self.listener, self.wakeup, self._wakeup_w, *self.by_conn):
                end.close()
            _child(request)
        running.pid = pid
        self.by_pid[pid] = running
        running.conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _reap(self) -> None:
        while self.by_pid:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            running = self.by_pid.pop(pid, None)
            if running is None or running.conn not in self.by_conn:
                continue
            try:
                done = {"rc": os.waitstatus_to_exitcode(status), "cpu": usage.ru_utime + usage.ru_stime}
                running.conn.sendall(json.dumps(done).encode() + b"\n")
            except OSError:
                pass
            self._close(running)

    def _close(self, running: _Running) -> None:
        self.sel.unregister(running.conn)
        running.conn.close()
        del self.by_conn[running.conn]

    def kill_all(self) -> None:
        for pid in list(self.by_pid):
            kill_group(pid)


def serve(path: str) -> None:
    """Warm up, then fork a child per request until SIGTERM or until the process that started it is gone;
    every child still running is then killed."""
    warm_up()
    # Every object made so far into the collector's permanent generation, so a child's collections never visit
    # them: a full collection in a fork writes to every object it visits, and the kernel then copies each page
    # the server's heap is on. Measured with runs interleaved in one script, each on a fresh server with and
    # without it: a child's start (before argv runs) 0.45 -> 0.05 CPU-s; a warm plan-only `dags test` 3.6 -> 2.4
    # CPU-s; a lifecycle run of train and fine-tune 5.0 -> 4.4. https://docs.python.org/3/library/gc.html#gc.freeze
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(path + ".new")
    finally:
        os.umask(old)
    listener.listen(16)
    os.rename(path + ".new", path)  # the name appears only once it accepts: clients wait for it
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    server = _Server(listener)
    parent = os.getppid()
    try:
        while not stopping and os.getppid() == parent:  # checked at least once a second
            server.step(timeout=1.0)
    finally:
        server.kill_all()
        listener.close()
        Path(path).unlink(missing_ok=True)


def kill_group(pid: int) -> None:
    """SIGKILL a child's process group (each child leads a session of its own); gone already is fine."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    serve(sys.argv[1])
