"""The FastAPI app the api-server mounts at ``/interlude`` (AirflowPlugin.fastapi_apps): Runs, Timeline, Fleet.

Auth is Airflow's own, not ours: the app runs inside the api-server, so its routes take the same FastAPI dependencies
the REST API does (`airflow.api_fastapi.core_api.security`): `get_user` reads the UI's session cookie or a bearer
token (none: 401, a bad token: 403), the auth manager says which DAGs the user may read (none of Interlude's: 403),
and the timeline of one run needs read access to that run's DAG (`requires_access_dag("GET", RUN)`). Handlers are
plain `def`: Starlette runs them in its thread pool, so their DB and GCS reads never block the api-server's loop.
https://airflow.apache.org/docs/apache-airflow/stable/administration-and-deployment/plugins.html
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' annotations at definition time, and the
# dependencies they name (GetUserDep) are imported inside create_app, where a string annotation would not find them.
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from interlude.ui import pages, svg
from interlude.ui.pages import URL_PREFIX
from interlude.ui.runs import DAGS, build_rows

MAX_RUNS = 200


def readable_interlude_dags(user: Any) -> list[str]:
    """Interlude's DAGs this user may read (the auth manager decides; none: 403)."""
    from airflow.api_fastapi.app import get_auth_manager

    allowed = get_auth_manager().get_authorized_dag_ids(user=user, method="GET")
    readable = [d for d in DAGS if d in allowed]
    if not readable:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "no read access to Interlude's DAGs")
    return readable


def _root(request: Request) -> str:
    return str(request.scope.get("root_path") or URL_PREFIX).rstrip("/")


def runs_html(root: str, user: Any, dag_id: str | None, state: str | None) -> str:
    from interlude.ui import source

    readable = readable_interlude_dags(user)
    if dag_id and dag_id not in readable:
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"no read access to {dag_id}")
    with source.read_only_session() as session:
        found = source.list_runs(session, [dag_id] if dag_id else readable, state or None, MAX_RUNS)
    return pages.runs_page(root, build_rows(found), dag_id or None, state or None, readable)


def load_timeline(dag_id: str, run_id: str) -> tuple[Any, list[str]]:
    """The run's timeline (None when there is nothing to draw yet) and notes; 404 for a run Airflow does not have."""
    from interlude.ui import source

    if dag_id not in DAGS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{dag_id} is not an Interlude DAG")
    with source.read_only_session() as session:
        found = source.run_xcoms(session, dag_id, run_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run_id} of {dag_id}")
    return source.timeline_for(*found)


def fleet_html(root: str, user: Any) -> str:
    from interlude.ui import source

    readable = readable_interlude_dags(user)
    with source.read_only_session() as session:
        active = [r for d in readable for r in source.list_runs(session, [d], "running", MAX_RUNS)]
    now = time.time()
    rows, errors = source.fleet(active, now)
    return pages.fleet_page(root, rows, now, errors)


def create_app() -> FastAPI:
    """Built when the api-server asks for the plugin's apps (imports Airflow's security module, so not at import)."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag

    app = FastAPI(title="Interlude", docs_url=None, redoc_url=None, openapi_url=None)
    read_run: Callable[..., None] = requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN)

    @app.get("/", include_in_schema=False)
    def index(request: Request, user: GetUserDep) -> RedirectResponse:
        readable_interlude_dags(user)  # like every page: no session 401, nothing readable 403 (not a redirect)
        return RedirectResponse(f"{_root(request)}/runs")

    @app.get("/runs", response_class=HTMLResponse)
    def runs(
        request: Request,
        user: GetUserDep,
        dag_id: Annotated[str | None, Query()] = None,
        state: Annotated[str | None, Query()] = None,
    ) -> HTMLResponse:
        return HTMLResponse(runs_html(_root(request), user, dag_id, state))

    @app.get("/timeline/{dag_id}/{run_id:path}", response_class=HTMLResponse, dependencies=[Depends(read_run)])
    def timeline(request: Request, dag_id: str, run_id: str) -> HTMLResponse:
        tl, notes = load_timeline(dag_id, run_id)
        picture = svg.render(tl) if tl is not None else ""
        return HTMLResponse(pages.timeline_page(_root(request), dag_id, run_id, tl, picture, notes))

    @app.get("/svg/{dag_id}/{run_id:path}", dependencies=[Depends(read_run)])
    def timeline_svg(dag_id: str, run_id: str) -> Response:
        tl, notes = load_timeline(dag_id, run_id)
        if tl is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "; ".join(notes))
        return Response(svg.render(tl), media_type="image/svg+xml")

    @app.get("/fleet", response_class=HTMLResponse)
    def fleet(request: Request, user: GetUserDep) -> HTMLResponse:
        return HTMLResponse(fleet_html(_root(request), user))

    return app
