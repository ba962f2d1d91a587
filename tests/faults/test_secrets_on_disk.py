"""Secrets on disk: what `make stack-up` and docker-compose.yaml leave where another user could read it.

The stack's own writers (include/scripts/stack.py) lay out a var dir as `up` does: PostgreSQL cluster,
airflow.cfg, the SimpleAuthManager password file, stack.json. Then every file under it is searched for
the secret *values* (not for the names we expect), so a secret copied into a new file is caught too.
PostgreSQL is asked directly: a login without a password must fail, over TCP and over the socket.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.stack_fixtures import load_stack_module

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
SECRET_VARS = ("POSTGRES_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET", "AIRFLOW_API_SECRET_KEY")


@pytest.fixture(scope="module")
def laid_out() -> Iterator[dict[str, Any]]:
    """A var dir written by stack.py's own functions, with its PostgreSQL running (stopped afterwards)."""
    stack = load_stack_module()
    if not (stack.PG_BIN / "initdb").exists() and os.geteuid() != 0:
        pytest.skip("PostgreSQL 15 is not installed and apt-get cannot run here (not root)")
    stack.ensure_packages()
    var_dir = Path(tempfile.mkdtemp(prefix="interlude-secrets-"))  # not pytest's 0700 root: `postgres` enters
    var_dir.chmod(0o711)
    password = stack.db_password(var_dir)
    try:
        pg_port = stack.start_postgres(var_dir / "postgres", 0, password)
        home = var_dir / "airflow"
        admin_password, jwt, fernet, api_secret = "adm-" + os.urandom(8).hex(), stack.jwt_secret(), "f" * 44, "s" * 43
        outsider_password = "out-" + os.urandom(8).hex()  # the user with no role stack.py adds
        password_file = stack.write_secret(
            home / "simple_auth_manager_passwords.json",
            json.dumps({stack.ADMIN_USER: admin_password, stack.OUTSIDER_USER: outsider_password}),
        )
        stack.write_airflow_cfg(
            home,
            pg_port=pg_port,
            redis_port=1,
            api_port=2,
            secret=api_secret,
            jwt_secret=jwt,
            fernet_key=fernet,
            password_file=password_file,
            db_password=password,
        )
        stack.write_state(
            var_dir,
            {
                "auth": {"username": stack.ADMIN_USER, "password": admin_password},
                "outsider": {"username": stack.OUTSIDER_USER, "password": outsider_password},
            },
        )
        yield {
            "stack": stack,
            "var_dir": var_dir,
            "pg_port": pg_port,
            "db_password": password,
            "secrets": [password, admin_password, outsider_password, jwt, fernet, api_secret],
        }
    finally:
        stack.stop_postgres(var_dir / "postgres")
        shutil.rmtree(var_dir, ignore_errors=True)


def _readable_files(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                yield path


def test_every_file_holding_a_secret_is_owner_only(laid_out: dict[str, Any]) -> None:
    holders: dict[Path, int] = {}
    for path in _readable_files(laid_out["var_dir"]):
        data = path.read_bytes()
        if any(secret.encode() in data for secret in laid_out["secrets"]):
            holders[path] = stat.S_IMODE(path.stat().st_mode)
    names = {p.name for p in holders}
    # The files we know of are among them (the search found what it should), and none is group/world readable.
    assert {"airflow.cfg", "stack.json", "simple_auth_manager_passwords.json", "db-password"} <= names, names
    loose = {str(p): oct(mode) for p, mode in holders.items() if mode & 0o077}
    assert not loose, f"secrets readable by others: {loose}"


def test_pg_hba_trusts_no_one(laid_out: dict[str, Any]) -> None:
    hba = (laid_out["var_dir"] / "postgres" / "data" / "pg_hba.conf").read_text()
    rules = [line.split() for line in hba.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert rules, "pg_hba.conf has no rules at all"
    assert all("trust" not in rule and "password" not in rule for rule in rules), rules  # `password` = cleartext
    assert all(rule[-1] == "scram-sha-256" for rule in rules), rules


def _psql(laid_out: dict[str, Any], host: str, password: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGPASSFILE"] = os.devnull  # no ~/.pgpass can help
    if password is not None:
        env["PGPASSWORD"] = password
    cmd = [
        str(laid_out["stack"].PG_BIN / "psql"),
        "-h",
        host,
        "-p",
        str(laid_out["pg_port"]),
        "-U",
        "airflow",
        "-d",
        "airflow",
        "-w",
        "-tAc",
        "SELECT current_user",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("over", ["tcp", "socket"])
def test_database_refuses_a_login_without_the_password(laid_out: dict[str, Any], over: str) -> None:
    host = "127.0.0.1" if over == "tcp" else str(laid_out["var_dir"] / "postgres")
    refused = _psql(laid_out, host, None)
    assert refused.returncode != 0 and "password" in refused.stderr, (refused.returncode, refused.stderr)
    wrong = _psql(laid_out, host, "not-the-password")
    assert wrong.returncode != 0 and "password authentication failed" in wrong.stderr, wrong.stderr
    if over == "tcp":  # (the socket dir is the postgres user's; root reaches it, another user would not)
        ok = _psql(laid_out, host, laid_out["db_password"])
        assert ok.returncode == 0 and ok.stdout.strip() == "airflow", ok.stderr


def test_jwt_secret_is_long_enough_for_hs512() -> None:
    """Airflow signs task tokens with HS512 given jwt_secret; PyJWT warns below 64 bytes (RFC 7518 3.2)."""
    import jwt

    secret = load_stack_module().jwt_secret()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        token = jwt.encode({"sub": "x"}, secret, algorithm="HS512")
        assert jwt.decode(token, secret, algorithms=["HS512"])["sub"] == "x"
    assert len(secret.encode()) >= 64


def test_compose_ships_no_secret_and_refuses_to_start_without_one() -> None:
    text = COMPOSE.read_text()
    env = yaml.safe_load(text)["x-airflow-common"]["environment"]
    assert env["AIRFLOW__CORE__FERNET_KEY"].startswith("${AIRFLOW_FERNET_KEY:?"), env["AIRFLOW__CORE__FERNET_KEY"]
    for var in SECRET_VARS:
        assert f"${{{var}:?" in text, f"{var} is not required"
        assert f"${{{var}:-" not in text and f"${{{var}-" not in text, f"{var} has a default"
    assert "trust" not in yaml.safe_load(text)["services"]["postgres"]["environment"].values()
    exe = shutil.which("docker-compose")
    if exe is None:
        return  # tests/test_docker_compose.py installs it when it may; the text checks above still ran
    empty = Path(tempfile.mkdtemp()) / "empty.env"
    empty.write_text("")
    env_vars = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "POSTGRES_", "INTERLUDE_"))}
    out = subprocess.run(
        [exe, "--env-file", str(empty), "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        env=env_vars,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode != 0 and "compose-env" in out.stderr, out.stderr
