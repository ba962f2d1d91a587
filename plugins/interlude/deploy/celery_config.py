"""The Celery configuration Interlude's workers run with: Airflow's own, plus `interlude.deploy.worker_preload`.

Set `[celery] celery_config_options = interlude.deploy.celery_config.CELERY_CONFIG` (docker-compose.yaml and the
local stack do) so that each Celery worker imports Interlude's Google and Kubernetes clients once, before it
forks its pool, instead of once per task (see interlude.deploy.worker_preload). Everything else is the Celery
provider's DEFAULT_CELERY_CONFIG, built from airflow.cfg as usual.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG

PRELOAD_MODULE = "interlude.deploy.worker_preload"

CELERY_CONFIG: dict[str, Any] = {
    **DEFAULT_CELERY_CONFIG,
    "imports": (*tuple(DEFAULT_CELERY_CONFIG.get("imports", ())), PRELOAD_MODULE),
}
