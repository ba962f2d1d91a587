"""The Airflow plugin: the Interlude app mounted in the api-server, and its entry in the UI's navigation.

Airflow 3's plugin interface (https://airflow.apache.org/docs/apache-airflow/stable/administration-and-deployment/plugins.html):
``fastapi_apps`` are mounted by the api-server under their ``url_prefix``; an ``external_views`` entry with a
``url_route`` puts a page in the navigation that the UI shows in an iframe at ``/plugin/<url_route>``. The app is
built only when the api-server reads ``fastapi_apps``: every Airflow process loads plugins (the scheduler, workers,
the triggerer), and none of them needs FastAPI routes or Airflow's security module imported.

Registered by `plugins/interlude_ui.py` (the plugins folder is scanned file by file; `plugins/.airflowignore` keeps
this package out of that scan).
"""

from __future__ import annotations

import functools
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from interlude.ui.pages import URL_PREFIX

NAV_ROUTE = "interlude"


@functools.cache
def _app() -> Any:
    from interlude.ui.app import create_app

    return create_app()


class InterludeUiPlugin(AirflowPlugin):
    """Runs, run timelines and the fleet's upcoming maintenance, inside the Airflow UI."""

    name = "interlude_ui"
    external_views = [
        {
            "name": "Interlude",
            # Relative: the UI's index sets <base href> to the api-server's base URL, so the iframe finds the app
            # under a proxy's path prefix too.
            "href": f"{URL_PREFIX.lstrip('/')}/runs",
            "url_route": NAV_ROUTE,
            "destination": "nav",
        }
    ]

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]  # built on first read, not at import
        return [{"app": _app(), "url_prefix": URL_PREFIX, "name": "Interlude"}]
