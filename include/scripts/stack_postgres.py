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

from stack_processes import log

PG_BIN = Path("/usr/lib/postgresql/15/bin")
DB_PASSWORD_FILE = "db-password"


# ---------------------------------------------------------------------------------------------- packages
def ensure_packages() -> None:
    """PostgreSQL 15 and redis-server from Debian, installed only when missing (needs root, as in CI); one
    process at a time installs (interlude.apt), so the suite's stack shards can both start on a fresh machine."""
    from interlude import apt

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


def start_postgres(pg_dir: Path, port: int, password: str) -> None:
    """Our own cluster with password (SCRAM) authentication for every connection, local socket included."""
    pg_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(pg_dir, "postgres", "postgres")
    os.chmod(pg_dir, 0o700)
    data = pg_dir / "data"
    if not (data / "PG_VERSION").exists():
        # initdb reads the superuser's password from a file (never the command line); gone right after.
        pwfile = write_secret(pg_dir / "initdb-password", password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        try:
            subprocess.run(
                _as_postgres(
                    [
                        str(PG_BIN / "initdb"),
                        "-D",
                        str(data),
                        "--auth=scram-sha-256",
                        f"--pwfile={pwfile}",
                        "-U",
                        "airflow",
                        "-E",
                        "UTF8",
                    ]
                ),
                check=True,
                stdout=subprocess.DEVNULL,
            )
        finally:
            pwfile.unlink(missing_ok=True)
    subprocess.run(
        _as_postgres(
            [
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                f"-k {pg_dir} -h 127.0.0.1 -p {port}",
                "-l",
                str(pg_dir / "postgres.log"),
                "-w",
                "-t",
                "60",
                "start",
            ]
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    env = _pg_env(password)
    exists = subprocess.run(
        [
            str(PG_BIN / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "airflow",
            "-d",
            "postgres",
            "-tAc",
            "SELECT 1 FROM pg_database WHERE datname='airflow'",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()
    if exists != "1":
        subprocess.run(
            [str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "airflow", "airflow"],
            check=True,
            env=env,
        )


def stop_postgres(pg_dir: Path) -> None:
    data = pg_dir / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "60", "stop"]),
            check=False,
            stdout=subprocess.DEVNULL,
        )
