"""The app's own decisions, without a running api-server: who may see which DAGs' runs, and that a page's DB
session is never committed. (Authentication itself, 401 without a session and 403 with a forged token, is Airflow's
dependency and is checked on the real stack: tests/e2e/test_zz_browser.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import HTTPException

from interlude.ui import app, source


class AuthManager:
    def __init__(self, readable: set[str]) -> None:
        self.readable = readable
        self.asked: list[tuple[Any, str]] = []

    def get_authorized_dag_ids(self, *, user: Any, method: str = "GET") -> set[str]:
        self.asked.append((user, method))
        return self.readable


@pytest.fixture
def auth(monkeypatch: pytest.MonkeyPatch) -> AuthManager:
    manager = AuthManager(set())
    monkeypatch.setattr("airflow.api_fastapi.app.get_auth_manager", lambda: manager)
    return manager


def test_a_user_who_may_read_none_of_interludes_dags_gets_403(auth: AuthManager) -> None:
    auth.readable = {"someone_elses_dag"}
    with pytest.raises(HTTPException) as refused:
        app.readable_interlude_dags("alice")
    assert refused.value.status_code == 403
    assert auth.asked == [("alice", "GET")]


def test_the_runs_page_shows_only_the_interlude_dags_the_user_may_read(auth: AuthManager) -> None:
    auth.readable = {"interlude_serving", "someone_elses_dag"}
    assert app.readable_interlude_dags("bob") == ["interlude_serving"]
    with pytest.raises(HTTPException) as refused:  # filtering on a DAG the user may not read: refused, not empty
        app.runs_html("/interlude", "bob", "interlude_training", None)
    assert refused.value.status_code == 403


class Session:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def commit(self) -> None:
        self.calls.append("commit")

    def rollback(self) -> None:
        self.calls.append("rollback")

    def close(self) -> None:
        self.calls.append("close")


def test_the_pages_db_session_is_rolled_back_and_closed_never_committed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Session] = []

    def factory() -> Session:
        made.append(Session())
        return made[-1]

    monkeypatch.setattr("airflow.settings.Session", factory)
    with source.read_only_session() as session:
        assert session is made[0]
    with pytest.raises(RuntimeError), source.read_only_session():
        raise RuntimeError("a read failed")
    assert [s.calls for s in made] == [["rollback", "close"], ["rollback", "close"]]
