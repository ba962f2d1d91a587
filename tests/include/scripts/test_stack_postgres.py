"""The stack's PostgreSQL start when its port is taken: a port found free can be bound by another process before
PostgreSQL binds it (a full suite run saw PostgreSQL exit at its start once). Real PostgreSQL clusters; the port is
really held by a listening socket of this test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.stack_fixtures import load_stack_module


@pytest.fixture
def pg_dir() -> Iterator[Path]:
    stack = load_stack_module()
    if not (stack.PG_BIN / "initdb").exists() or os.geteuid() != 0:
        pytest.skip("needs PostgreSQL 15 and root (initdb runs as the postgres user)")
    var_dir = Path(tempfile.mkdtemp(prefix="interlude-pg-"))  # not pytest's 0700 root: `postgres` enters
    var_dir.chmod(0o711)
    try:
        yield var_dir / "postgres"
    finally:
        stack.stop_postgres(var_dir / "postgres")
        shutil.rmtree(var_dir, ignore_errors=True)


@pytest.fixture
def taken() -> Iterator[int]:
    """A port on 127.0.0.1 with a listener on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _port_answering(stack: Any, port: int, password: str) -> str:
    return subprocess.run(
        [
            str(stack.PG_BIN / "psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "airflow",
            "-d",
            "airflow",
            "-tAc",
            "SHOW port",
        ],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PGPASSWORD": password},
    ).stdout.strip()


def test_a_free_port_taken_before_postgres_binds_it_means_another_port(
    pg_dir: Path, taken: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = load_stack_module()
    chooser = sys.modules["stack_postgres"]
    ports = iter([taken, stack.free_port()])  # the race, made certain: the first port found is bound meanwhile
    monkeypatch.setattr(chooser, "free_port", lambda: next(ports))
    port = stack.start_postgres(pg_dir, 0, "pw-1")
    assert port != taken
    assert _port_answering(stack, port, "pw-1") == str(port)  # the server itself says where it listens
    assert "Address already in use" in (pg_dir / "postgres.log").read_text()  # the first try met the taken port


def test_a_port_asked_for_by_number_is_kept_and_a_failure_shows_the_servers_own_words(pg_dir: Path, taken: int) -> None:
    stack = load_stack_module()
    with pytest.raises(RuntimeError, match=rf"127\.0\.0\.1:{taken}(.|\n)*Address already in use"):
        stack.start_postgres(pg_dir, taken, "pw-2")
