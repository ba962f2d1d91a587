"""Registers Interlude's UI plugin (interlude.ui.plugin): the plugins folder's one scanned file.

Airflow imports every .py file of the plugins folder as a top-level module and registers the AirflowPlugin
subclasses it finds; the `interlude` package itself is kept out of that scan by `.airflowignore`.
"""

from interlude.ui.plugin import InterludeUiPlugin

__all__ = ["InterludeUiPlugin"]
