"""The local stack's PostgreSQL: Debian's packages (installed when missing), its own cluster with password
(SCRAM) authentication, and the secrets it needs written 0600 from the first byte. Split out of stack.py,
which re-exports these names (tests and the secrets check use them through it).
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path

from stack_processes import free_port, log

PG_BIN = Path("/usr/lib/postgresql/15/bin")
DB_PASSWORD_FILE = "db-password"


# ---------------------------------------------------------------------------------------------- packages
def ensure_packages() -> None:
    """PostgreSQL 15 and redis-server from Debian, installed only when missing (needs root, as in CI); one
    process at a time installs (interlude_dev.apt), so the suite's stack shards can both start on a fresh machine."""
    from interlude_dev import apt

    apt.ensure(
        {"postgresql-15": (PG_BIN / "initdb").exists, "redis-server": lambda: bool(shutil.which("redis-server"))},
        log,
    )
    # Debian's postgresql package starts the system cluster; ours is separate, so leave that one alone.


# ---------------------------------------------------------------------------------------------- postgres
def _as_postgres(cmd: list[str]) -> list[str]:
    """initdb refuses to run as root: as root, run PostgreSQL tools as the `postgres` user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def write_secret(path: Path, text: str) -> Path:
    """Create or replace a file holding a secret, readable by its owner only (0600 from the first byte)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)
    return path


def db_password(var_dir: Path) -> str:
    """The `airflow` database role's password: made once per var dir, kept 0600 beside the cluster."""
    path = var_dir / DB_PASSWORD_FILE
    if path.exists():
        return path.read_text().strip()
    password = secrets.token_hex(24)  # hex: safe unquoted in a SQLAlchemy URL
    write_secret(path, password)
    return password


def _pg_env(password: str) -> dict[str, str]:
    return {**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}


PORT_TRIES = 5
LOG_TAIL_CHARS = 2000


def start_postgres(pg_dir: Path, port: int, password: str) -> int:
    """Our own cluster with password (SCRAM) authentication for every connection, local socket included; returns
    the port it listens on (127.0.0.1).

    `port` 0: a free port, and another one when some other process binds it first (a port found free stays free
    only until someone binds it, and the suite's workers start servers and open connections all the time: seen
    once in a full run, PostgreSQL exiting at its start). A port asked for by number is not changed.
    """
    pg_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(pg_dir, "postgres", "postgres")
    os.chmod(pg_dir, 0o700)
    if not (pg_dir / "data" / "PG_VERSION").exists():
        _initdb(pg_dir, password)
    for attempt in range(1, PORT_TRIES + 1):
        chosen = port or free_port()
        failure = _pg_ctl_start(pg_dir, chosen)
        if failure is None:
            break
        if port or "Address already in use" not in failure or attempt == PORT_TRIES:
            raise RuntimeError(f"PostgreSQL did not start on 127.0.0.1:{chosen}; the end of its log:\n{failure}")
        log(f"127.0.0.1:{chosen} was taken before PostgreSQL bound it; trying another port")
    _create_database(chosen, password)
    return chosen


def _initdb(pg_dir: Path, password: str) -> None:
    # initdb reads the superuser's password from a file (never the command line); gone right after.
    pwfile = write_secret(pg_dir / "initdb-password", password + "\n")
    if os.geteuid() == 0:
        shutil.chown(pwfile, "postgres", "postgres")
    try:
        initdb = [str(PG_BIN / "initdb"), "-D", str(pg_dir / "data"), "--auth=scram-sha-256", f"--pwfile={pwfile}"]
        subprocess.run(_as_postgres([*initdb, "-U", "airflow", "-E", "UTF8"]), check=True, stdout=subprocess.DEVNULL)
    finally:
        pwfile.unlink(missing_ok=True)


def _pg_ctl_start(pg_dir: Path, port: int) -> str | None:
    """None once the server accepts connections; else the end of its log (pg_ctl only says to read it)."""
    server_log = pg_dir / "postgres.log"
    start = server_log.stat().st_size if server_log.exists() else 0
    options = f"-k {pg_dir} -h 127.0.0.1 -p {port}"
    cmd = [str(PG_BIN / "pg_ctl"), "-D", str(pg_dir / "data"), "-o", options, "-l", str(server_log)]
    done = subprocess.run(
        _as_postgres([*cmd, "-w", "-t", "60", "start"]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if done.returncode == 0:
        return None
    logged = ""
    if server_log.exists():
        with server_log.open(errors="replace") as f:
            f.seek(start)
            logged = f.read()
    return (logged + done.stderr)[-LOG_TAIL_CHARS:]


def _create_database(port: int, password: str) -> None:
    env = _pg_env(password)
    where = ["-h", "127.0.0.1", "-p", str(port), "-U", "airflow"]
    exists = subprocess.run(
        [str(PG_BIN / "psql"), *where, "-d", "postgres", "-tAc", "SELECT 1 FROM pg_database WHERE datname='airflow'"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    if exists != "1":
        subprocess.run([str(PG_BIN / "createdb"), *where, "airflow"], check=True, env=env)


def stop_postgres(pg_dir: Path) -> None:
    data = pg_dir / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )
