"""Debian packages the local stack and some tests need (PostgreSQL 15, redis-server, docker-compose), installed
with apt-get when missing, one install at a time across processes.

Why the lock: on a fresh machine the suite's xdist workers (the stack's two shards, the secrets test) find the same
packages missing at the same moment. A second `apt-get update` or `install` does not wait for the first: it exits
100 on dpkg's or the package lists' lock, and the tests behind it error. Here each caller takes an exclusive
`flock`, then looks again: whoever waited finds the packages there and runs nothing. `DPkg::Lock::Timeout` makes
apt itself wait for any other apt user (an unattended upgrade, CI's own install) instead of failing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

LOCK_FILE = Path(os.environ.get("INTERLUDE_APT_LOCK", "/var/lib/apt/interlude-install.lock"))
LOCK_TIMEOUT_SECONDS = 600
COMMAND_TIMEOUT_SECONDS = 1800  # a slow mirror, never forever


class CannotInstall(RuntimeError):
    """Packages are missing and this process may not run apt-get (not root, or no apt-get)."""


def missing(packages: Mapping[str, Callable[[], bool]]) -> list[str]:
    """The Debian package names whose presence check says no."""
    return [name for name, present in packages.items() if not present()]


def ensure(packages: Mapping[str, Callable[[], bool]], log: Callable[[str], None] = lambda _: None) -> None:
    """Install the packages (Debian name -> presence check) that are missing; nothing when none is.

    Raises CannotInstall when some are missing and apt-get cannot run here, CalledProcessError when it fails.
    """
    absent = missing(packages)
    if not absent:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise CannotInstall(f"missing {absent}; run as root (apt-get) or install them yourself")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = ["-o", f"DPkg::Lock::Timeout={LOCK_TIMEOUT_SECONDS}"]
    with LOCK_FILE.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, and by the kernel if we die
        todo = missing(packages)  # again: another process may have installed them while we waited
        if not todo:
            return
        log(f"installing {todo} with apt-get")
        for cmd in (
            ["apt-get", *wait, "update", "-q"],
            ["apt-get", *wait, "install", "-y", "-q", "--no-install-recommends", *todo],
        ):
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, timeout=COMMAND_TIMEOUT_SECONDS)
