"""What a Celery worker imports once, before it forks its pool, so that no task process imports it again.

On the CeleryExecutor every Airflow task runs in a process forked from a pool child of the worker: whatever
that process imports, it imports afresh for each task, and the libraries Interlude's tasks use are large.
Measured on the 2-core machine (CPU seconds in a process that already holds Airflow's task runner):
the Google provider's base hook 0.5 s, the GKE hooks (Kubernetes client, cncf provider) 3.8 s: paid by nearly every
training task and every serving task, several seconds of start-up each on a loaded machine. Imported here
once, they are inherited, already loaded, by every task process the worker forks.

`interlude.deploy.celery_config.CELERY_CONFIG` lists this module in Celery's `imports` setting (imported by the
worker's main process at start, before the pool exists). Nothing here opens a connection, builds a client
or starts a thread: a fork must not copy one (tests/plugins/interlude/deploy/test_worker_preload.py).
"""

from __future__ import annotations

import importlib

# The modules Interlude's tasks import beyond what their DAG file does (clients are imported lazily there so
# that DAG parsing stays light: tests/dags/test_dag_integrity.py).
PRELOAD = (
    "airflow.providers.google.common.hooks.base_google",
    "google.cloud.tpu_v2",
    "google.cloud.storage",
    "interlude.hooks.compute",
    "interlude.hooks.tpu",
    "interlude.hooks.gke",
    "interlude.operators.capacity",
    "interlude.operators.provision",
    "interlude.operators.stage",
    "interlude.operators.stage_actions",
    "interlude.operators.serving",
    "interlude.operators.serving_maintenance",
    "interlude_workload.checkpoints",
    "interlude_workload.startup",
)

for _name in PRELOAD:
    importlib.import_module(_name)
