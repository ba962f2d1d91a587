"""interlude_dev.warm_cli and its server (interlude_dev.warm_server): a forked child is the caller's process
(environment, directory, Airflow home, exit code, log), really killed on kill, timeout or hang-up, and the
server goes when the process that started it goes.

The children here run Python code (`python -c`) through the same path as `airflow dags test`; the end-to-end
comparison of a warm and a cold `dags test` is tests/e2e/test_warm_dags_test.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from interlude_dev import warm_cli
from interlude_dev import wiring as dev

REPORT = """
import json, os, sys
import airflow.configuration
from airflow import settings
from airflow.configuration import conf
out = {
    "argv": sys.argv[1:],
    "env": dict(os.environ),
    "cwd": os.getcwd(),
    "pid": os.getpid(),
    "session": os.getsid(0),
    "home": airflow.configuration.AIRFLOW_HOME,
    "db": settings.SQL_ALCHEMY_CONN,
    "dags_folder": conf.get("core", "dags_folder"),
    "base_log_folder": conf.get("logging", "base_log_folder"),
    "cmdline": open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode(),
}
print(json.dumps(out))
sys.exit(int(sys.argv[1]))
"""

SLEEP = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(600)
"""


def _airflow_env(home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dev.ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(dev.ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[warm_cli.WarmServer]:
    home = tmp_path_factory.mktemp("server-env-home")
    warm = warm_cli.WarmServer({**os.environ, **_airflow_env(home), "ONLY_IN_THE_SERVER": "1"})
    yield warm
    warm.stop()


def _request(code: str, argv: list[str], env: dict[str, str], log: Path, cwd: Path) -> dict[str, object]:
    return {"argv": argv, "env": env, "cwd": str(cwd), "log": str(log), "python_c": code}


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError):
            return True
        if state == "Z":  # dead, not yet reaped by its parent
            return True
        time.sleep(0.05)
    return False


def test_a_child_is_the_callers_process_with_its_own_airflow_home(server: warm_cli.WarmServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {**_airflow_env(home), "ONLY_IN_THE_CALLER": "yes"}
    log = tmp_path / "child.log"
    proc = server.start(_request(REPORT, ["3", "a b"], env, log, cwd=tmp_path))
    assert proc.wait(60) == 3
    seen = json.loads(log.read_text().strip().splitlines()[-1])

    assert seen["argv"] == ["3", "a b"]
    assert seen["env"]["ONLY_IN_THE_CALLER"] == "yes"
    assert "ONLY_IN_THE_SERVER" not in seen["env"]
    assert seen["cwd"] == str(tmp_path)
    assert seen["pid"] == proc.pid != server.proc.pid
    assert seen["session"] == proc.pid  # a session of its own: a kill takes its whole group
    # Airflow's home and what derives from it are the caller's, not the server's.
    assert seen["home"] == str(home)
    assert seen["db"] == f"sqlite:///{home}/airflow.db"
    assert seen["base_log_folder"] == f"{home}/logs"
    assert seen["dags_folder"] == str(dev.ROOT / "dags")
    assert seen["cmdline"].startswith(f"{sys.executable} -c 3 a b")  # what `ps` shows: the command


def _reaped_cpu_seconds(pid: int) -> float:
    """The kernel's count of CPU spent by the children `pid` has reaped (cutime + cstime, /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def test_the_cpu_a_child_reports_is_what_it_spent(server: warm_cli.WarmServer, tmp_path: Path) -> None:
    """The server's figure (wait4 at the child's exit) is the kernel's count for that child: the server's count of
    its reaped children's CPU grows by it, to the clock tick (the child burnt a second; its own count is in
    own.txt)."""
    burn = (
        "import sys, time\n"
        "end = time.process_time() + 1.0\n"
        "while time.process_time() < end: pass\n"
        "open(sys.argv[1], 'w').write(str(time.process_time()))\n"
    )
    own = tmp_path / "own.txt"
    before = warm_cli.WarmProcess.finished_cpu_seconds
    reaped_before = _reaped_cpu_seconds(server.proc.pid)
    proc = server.start(_request(burn, [str(own)], _airflow_env(tmp_path), tmp_path / "burn.log", cwd=tmp_path))
    assert proc.wait(120) == 0
    assert proc.cpu_seconds is not None
    reaped = _reaped_cpu_seconds(server.proc.pid) - reaped_before
    tick = 1 / os.sysconf("SC_CLK_TCK")
    assert proc.cpu_seconds == pytest.approx(reaped, abs=2 * tick), (proc.cpu_seconds, reaped, own.read_text())
    # ...and it is added to this process's total of warm children (what suite_cpu.py --by-test reads)
    assert warm_cli.WarmProcess.finished_cpu_seconds - before == pytest.approx(proc.cpu_seconds)


def test_a_childs_start_and_full_collection_copy_little_of_the_servers_heap(
    server: warm_cli.WarmServer, tmp_path: Path
) -> None:
    """The kernel's count of the child's page faults (each a page copied or mapped since the fork) through its
    start (Airflow's configuration rebuilt) and a full collection, against the server's resident pages: the
    server's objects are frozen, so the child's collector does not write to them (without `gc.freeze` in the
    server: 34,000 faults, ~45 % of its pages; with it: ~5,700)."""
    faults = (
        "import gc, resource, sys\n"
        "gc.collect()\n"
        "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_SELF).ru_minflt))\n"
    )
    out = tmp_path / "faults.txt"
    resident_pages = int(Path(f"/proc/{server.proc.pid}/statm").read_text().split()[1])
    proc = server.start(_request(faults, [str(out)], _airflow_env(tmp_path), tmp_path / "gc.log", cwd=tmp_path))
    assert proc.wait(60) == 0, (tmp_path / "gc.log").read_text()
    assert int(out.read_text()) < resident_pages * 0.2, (int(out.read_text()), resident_pages)


def test_an_uncaught_error_is_in_the_log_and_fails_the_command(server: warm_cli.WarmServer, tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    proc = server.start(_request("raise ValueError('boom 42')", [], _airflow_env(tmp_path), log, cwd=tmp_path))
    assert proc.wait(60) == 1
    assert "ValueError: boom 42" in log.read_text()


def test_kill_timeout_and_hang_up_each_end_the_child(
    server: warm_cli.WarmServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _airflow_env(tmp_path)
    # kill(): the child is gone and its exit says SIGKILL.
    proc = server.start(_request(SLEEP, [str(tmp_path / "a.pid")], env, tmp_path / "a.log", cwd=tmp_path))
    _wait_for(tmp_path / "a.pid")
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL
    assert _gone(proc.pid)

    # A timeout through run_airflow kills it too, as subprocess.run does.
    monkeypatch.setenv(warm_cli.SWITCH_ENV, "1")
    monkeypatch.setattr(warm_cli, "_SERVER", server)  # this module's server, not a second warm-up
    with pytest.raises(subprocess.TimeoutExpired):
        warm_cli.run_airflow([str(tmp_path / "b.pid")], env, tmp_path / "b.log", timeout=15, python_c=SLEEP)
    assert _gone(int((tmp_path / "b.pid").read_text()))

    # A caller that is killed takes its child with it (the server sees the connection close).
    caller = (
        "import json, os, sys, time\n"
        "from interlude_dev import warm_cli\n"
        "proc = warm_cli.WarmProcess(sys.argv[1], json.loads(sys.argv[2]))\n"
        "print(proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    request = _request(SLEEP, [str(tmp_path / "c.pid")], env, tmp_path / "c.log", cwd=tmp_path)
    killed = subprocess.Popen(
        [sys.executable, "-c", caller, server.path, json.dumps(request)], stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(killed.stdout.readline())  # type: ignore[union-attr]
        _wait_for(tmp_path / "c.pid")
        killed.kill()
        killed.wait()
        assert _gone(child)
    finally:
        killed.kill()


def test_the_socket_is_private_to_its_user(server: warm_cli.WarmServer) -> None:
    assert stat.S_IMODE(server.dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600


def test_a_shared_server_is_waited_for_while_it_warms_up_and_goes_with_the_process_that_started_it(
    tmp_path: Path,
) -> None:
    """What the suite's xdist controller does (tests/conftest.py): share_server returns before the server listens,
    a process named to it (SOCKET_ENV) waits and gets its child from it, not from a server of its own; and the
    server goes when its starter is killed."""
    starter = (
        "import os, sys, time\n"
        "from interlude_dev import warm_cli\n"
        "s = warm_cli.share_server(dict(os.environ))\n"
        "print(s.proc.pid, s.dir, os.environ[warm_cli.SOCKET_ENV], flush=True)\n"
        "time.sleep(600)\n"
    )
    env = {**os.environ, **_airflow_env(tmp_path)}
    env.pop(warm_cli.SOCKET_ENV, None)
    parent = subprocess.Popen([sys.executable, "-c", starter], env=env, stdout=subprocess.PIPE, text=True)
    try:
        pid_text, server_dir, socket_path = parent.stdout.readline().split()  # type: ignore[union-attr]
        server_pid = int(pid_text)
        assert socket_path == str(Path(server_dir, "sock"))
        assert not Path(socket_path).exists(), "share_server waited for the warm-up"  # Airflow takes seconds
        seen = _via_inherited(socket_path, tmp_path)
        assert seen["code"] == 0 and seen["parent"] == server_pid, seen
        parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
        parent.wait()
        assert _gone(server_pid, within=15), "the warm server outlived the process that started it"
        assert not Path(socket_path).exists()
    finally:
        parent.kill()


def _wait_for(path: Path, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


# A process a test starts (a benchmark, a demo) runs its Airflow commands through the warm server named in
# SOCKET_ENV: the child it gets is forked by that server, not by a server of its own.
VIA_INHERITED = """
import json, sys
from pathlib import Path
from interlude_dev import warm_cli
log = Path(sys.argv[1])
proc = warm_cli.start_airflow([], json.loads(sys.argv[2]), log, python_c="import os; print(os.getppid())")
code = proc.wait(120)
parent = int(log.read_text().split()[-1])
cmdline = Path(f"/proc/{parent}/cmdline").read_bytes().replace(b"\\0", b" ").decode()
print(json.dumps({"code": code, "parent": parent, "parent_cmdline": cmdline}))
"""


def _via_inherited(socket_path: str, tmp_path: Path) -> dict[str, object]:
    env = {**os.environ, warm_cli.SWITCH_ENV: "1", warm_cli.SOCKET_ENV: socket_path}
    done = subprocess.run(
        [sys.executable, "-c", VIA_INHERITED, str(tmp_path / "child.log"), json.dumps(_airflow_env(tmp_path / "home"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.splitlines()[-1]))


def test_a_process_started_here_uses_the_server_named_in_its_environment(
    server: warm_cli.WarmServer, tmp_path: Path
) -> None:
    seen = _via_inherited(server.path, tmp_path)
    assert seen["code"] == 0 and seen["parent"] == server.proc.pid, seen


def test_a_named_server_that_is_gone_means_a_server_of_its_own(tmp_path: Path) -> None:
    seen = _via_inherited(str(tmp_path / "no-such-socket"), tmp_path)
    assert seen["code"] == 0, seen
    assert "-m interlude_dev.warm_server" in str(seen["parent_cmdline"]), seen  # forked by a warm server...
    assert str(tmp_path) not in str(seen["parent_cmdline"])  # ...not listening on the missing socket's path


def test_a_server_that_spends_its_cpu_budget_without_listening_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start is bounded by the server's own CPU, not by a wall clock a loaded machine stretches: a server
    over its budget (here a tenth of a CPU-second, less than Airflow's imports) is stopped, and the error says
    so; the wall bound stays far off."""
    monkeypatch.setattr(warm_cli, "STARTUP_CPU_SECONDS", 0.1)
    with pytest.raises(RuntimeError, match=r"not listening after \d+ CPU-s of its own") as raised:
        warm_cli.WarmServer({**os.environ, **_airflow_env(tmp_path)})
    assert warm_cli.STARTUP_SECONDS >= 600, "the wall bound is for a server that gets nowhere"
    pid = int(re.search(r"server pid (\d+)", str(raised.value))[1])  # type: ignore[index]
    assert _gone(pid), "the server over its budget was not stopped"
