"""The local stack's processes: each component in a process group of its own, its output in a log, and stopping
groups (SIGTERM, then SIGKILL) without touching a pid that a crash or reboot gave to someone else. Split out of
stack.py, which re-exports these names.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOFILE = 8192


def log(msg: str) -> None:
    print(f"[stack] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    """A port on 127.0.0.1 nobody listens on now (another process may bind it before the caller does)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- processes
def _raise_nofile() -> None:
    """Runs in the child before exec: the triggerer keeps one open log file per trigger."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def spawn(name: str, cmd: list[str], env: dict[str, str], logs: Path) -> subprocess.Popen[bytes]:
    """One component, its own process group (so `down` reaches its children), output in logs/NAME.log."""
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_raise_nofile,
            cwd=str(ROOT),
        )


def reap(pid: int) -> None:
    """Collect pid if it is our child and has exited (else its zombie would look alive in /proc)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def pid_alive(pid: int) -> bool:
    reap(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def start_time(pid: int) -> int | None:
    """The kernel's start time of pid (clock ticks since boot): with the pid, identifies one process.

    Not the command line: Celery rewrites its process title, and a reused pid would match a name check.
    """
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def stop_group(pid: int, started: int | None = None, grace: float = 20.0) -> None:
    """SIGTERM the process group led by pid, then SIGKILL what is left after `grace` seconds.

    `started` (from start_time) guards a pid reused by an unrelated process after a crash or reboot.
    """
    stop_groups({pid: started}, grace)


def stop_groups(groups: dict[int, int | None], grace: float = 20.0) -> None:
    """`stop_group` for several groups at once: all are signalled together and waited for under one deadline,
    so stopping the stack takes as long as its slowest component (the api-server's graceful shutdown, the
    worker's warm shutdown), not the sum of them (measured: 17 s one after another)."""
    pids = []
    for pid, started in groups.items():
        if started is not None and pid_alive(pid) and start_time(pid) != started:
            log(f"pid {pid} is not ours any more; leaving it alone")
        else:
            pids.append(pid)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                reap(pid)
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            for pid in pids:
                reap(pid)
            pids = [pid for pid in pids if group_alive(pid)]
            if pids:
                time.sleep(0.1)
        if not pids:
            return
