"""The app's own decisions: who may see which DAGs' runs, and that a page's DB session is never committed; and each
route's permission check through Airflow's own api-server app with its real auth manager (route_access.py: a user
with no role gets 403, no session 401, a viewer the page). The real stack checks the same in a browser:
tests/e2e/test_zz_interlude_view.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
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


# Every route of the app with a permission check, as a browser asks for it. The timeline's run is the serving run
# route_access.py seeds: drawn from its XComs alone, so a viewer gets the page (200), not a 404 for a missing run.
RUN = "interlude_serving/manual__bench_0000"
ROUTES = {
    "/interlude/": 307,  # to the Runs page
    "/interlude/runs": 200,
    "/interlude/runs?dag_id=interlude_training": 200,
    "/interlude/fleet": 200,
    f"/interlude/timeline/{RUN}": 200,
    f"/interlude/svg/{RUN}": 200,
}


@pytest.fixture(scope="module")
def answers(airflow_db_template: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, int]]:
    """Each route's status for no session, the user with no role and the viewer (one process for them all)."""
    home = tmp_path_factory.mktemp("ui-airflow")
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("route_access.py")), str(home), *ROUTES],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return dict(json.loads(line.removeprefix("RESULT ")))


@pytest.mark.parametrize("path", ROUTES)
def test_each_route_refuses_no_session_401_and_a_user_without_a_role_403_and_serves_a_viewer(
    answers: dict[str, dict[str, int]], path: str
) -> None:
    assert answers[path] == {"none": 401, "outsider": 403, "viewer": ROUTES[path]}, path
