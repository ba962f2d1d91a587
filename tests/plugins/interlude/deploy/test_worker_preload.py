"""interlude.deploy.worker_preload: Celery's own loader imports it in the worker's main process, before the pool is
forked; importing it opens nothing a fork would copy (no thread)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]

PROBE = """
import json, sys, threading
import airflow.sdk.execution_time.task_runner  # what every task process holds anyway
before = {t.name for t in threading.enumerate()}
from celery import Celery
from interlude.deploy.celery_config import CELERY_CONFIG
app = Celery("probe")
app.config_from_object(CELERY_CONFIG)
app.loader.init_worker()  # what `celery worker` does in its main process before starting the pool
from interlude.deploy.worker_preload import PRELOAD
print(json.dumps({
    "imports": list(app.conf.imports),
    "missing": [m for m in PRELOAD if m not in sys.modules],
    "new_threads": sorted({t.name for t in threading.enumerate()} - before),
}))
"""


def test_celerys_loader_imports_the_preload_before_the_pool_and_it_starts_no_thread(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    env["AIRFLOW__CELERY__BROKER_URL"] = "redis://127.0.0.1:1/0"  # never contacted: nothing connects at import
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert "interlude.deploy.worker_preload" in probe["imports"]
    assert probe["missing"] == []
    assert probe["new_threads"] == [], probe["new_threads"]
