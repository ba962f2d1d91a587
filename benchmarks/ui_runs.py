"""How fast the Interlude view's Runs page answers with N runs in Airflow's metadata DB (issue 36: 200 runs, < 1 s).

Measured through Airflow's own api-server app (`airflow.api_fastapi.app.create_app`, which mounts the plugin from the
plugins folder as the real api-server does) with SimpleAuthManager's bearer token, in process (Starlette's
TestClient: no socket, so the figure is the server's work, not the network's). The metadata DB is a migrated SQLite
home of its own (a copy of the suite's template when `INTERLUDE_AIRFLOW_DB_TEMPLATE` names one), seeded with N runs
split between stand-ins of the two Interlude DAGs (same dag ids and the task ids the page reads) whose tasks'
return values have the shapes the real tasks return (RunSpec, MachineRecord, stage results, run report; ServeSpec,
rollout, watch, serving report).

Baseline: Airflow's own REST list of the same runs (`GET /api/v2/dags/~/dagRuns?limit=N`), timed the same way in
the same process, a page every Airflow user already waits for. Wall and CPU (this process: server and client are one)
per request; the first request of each is shown apart (it loads plugins and warms caches).

    .venv/bin/python benchmarks/ui_runs.py                 # 200 runs, 10 requests each
    .venv/bin/python benchmarks/ui_runs.py --runs 5 --repeat 2 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GOAL_S = 1.0

DAG_FILE = '''"""Written by benchmarks/ui_runs.py: stand-ins of Interlude's DAGs with the task ids the page reads."""
import pendulum
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

for dag_id, tasks in {tasks!r}.items():
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False):
        for task_id in tasks:
            EmptyOperator(task_id=task_id)
'''


def environment(home: Path) -> None:
    """Airflow's settings for this process, set before Airflow is imported."""
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__API_AUTH__JWT_SECRET": "ui-runs-benchmark-secret-" + "0123456789abcdef" * 4,
            "AIRFLOW__API__SECRET_KEY": "ui-runs-benchmark-secret-" + "0123456789abcdef" * 4,
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",  # no access-log line per timed request
        }
    )


def xcoms(dag_id: str, i: int, t0: float) -> dict[str, Any]:
    """Return values of the shapes the real tasks return (what the page reads), a little different per run."""
    if dag_id == "interlude_training":
        key = f"interlude-training-bench-{i:04d}"
        return {
            "resolve_run": {"run_key": key, "bucket": "bench", "train_steps": 2000, "finetune_steps": 500},
            "provision": {
                "kind": "tpu_node" if i % 3 else "gce_vm",
                "zone": ("us-east5-a", "us-central2-b", "europe-west4-a")[i % 3],
                "name": f"{key}-m",
                "accelerator_type": "v6e-8" if i % 3 else "nvidia-h100-80gb",
                "accelerator_count": 8,
                "machine_type": None,
                "runtime": "v2-alpha-tpuv6e",
                "mode": "spot" if i % 5 == 0 else "on_demand",
                "body": {"labels": {"interlude-run": key}, "metadata": {"startup-script": "#!/bin/bash\n" * 40}},
            },
            "train": {"stage": "train", "steps": 2000, "final_step": 2000, "final_uri": f"gs://bench/{key}/train"},
            "finetune": {"stage": "finetune", "steps": 500, "final_step": 500, "final_uri": f"gs://bench/{key}/ft"},
            "run_report": {
                "uri": f"gs://bench/{key}/report.json",
                "events": i % 4,
                "goodput": 0.97,
                "steps_recomputed": i % 7,
            },
        }
    return {
        "resolve": {"cluster": "interlude-serving", "location": "us-central1", "name": f"vllm-{i}", "tpu_type": "v6e"},
        "rollout": {"fallbacks": [{"at": t0, "action": "fallback_to_gpu", "reason": "stockout", "order": "gpu_first"}]},
        "maintenance_watch": {
            "decisions": [{"at": t0, "kind": k, "node": "n", "reason": "r"} for k in ("cordon", "drain")]
        },
        "report": {
            "pods_per_accelerator": {"gpu": 2, "tpu": 1},
            "fallbacks": [{"at": t0, "action": "fallback_to_gpu", "reason": "stockout"}],
            "requests_per_accelerator": {"gpu": {"answered": 120, "failed": 0}, "tpu": {"answered": 30, "failed": 0}},
            "pods_over_time": [{"at": t0 + s, "rv": s, "counts": {"gpu": s % 3, "tpu": 1}} for s in range(40)],
            "notes": [],
        },
    }


def seed(home: Path, runs: int) -> None:
    """The stand-in DAGs serialized as `airflow dags reserialize` does, then N runs with their tasks' return values."""
    from airflow._shared.timezones import timezone
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.models.dagbag import DBDagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    from interlude.ui.runs import TASKS

    (home / "dags").mkdir(parents=True, exist_ok=True)
    (home / "dags" / "interlude_standins.py").write_text(DAG_FILE.format(tasks={k: list(v) for k, v in TASKS.items()}))
    with create_session() as session:
        manager = DagBundlesManager()
        manager.sync_bundles_to_db(session=session)
        session.commit()
        for bundle in manager.get_all_dag_bundles():
            bundle.initialize()
            bag = BundleDagBag(bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
            sync_bag_to_db(bag, bundle.name, bundle_version=None, session=session)
        session.commit()
        t0 = time.time() - 86400
        dags = {d: DBDagBag().get_latest_version_of_dag(d, session=session) for d in TASKS}
        for i in range(runs):
            dag_id = "interlude_training" if i % 4 else "interlude_serving"
            run_id = f"manual__bench_{i:04d}"
            dag = dags[dag_id]
            assert dag is not None, f"{dag_id} was not serialized"
            dag.create_dagrun(
                run_id=run_id,
                run_after=timezone.utcnow(),
                run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.TEST,
                state=(DagRunState.SUCCESS, DagRunState.FAILED, DagRunState.RUNNING)[i % 3],
                session=session,
            )
            session.flush()
            for task_id, value in xcoms(dag_id, i, t0).items():
                XComModel.set("return_value", value, dag_id=dag_id, task_id=task_id, run_id=run_id, session=session)


def timed(client: Any, path: str, token: str, repeat: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    walls, cpus, size = [], [], 0
    for _ in range(repeat + 1):
        cpu, wall = time.process_time(), time.perf_counter()
        response = client.get(path, headers=headers)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        if response.status_code != 200:
            raise SystemExit(f"GET {path}: {response.status_code} {response.text[:500]}")
        size = len(response.content)
    rest = walls[1:] or walls
    return {
        "path": path,
        "first_s": round(walls[0], 4),
        "median_s": round(statistics.median(rest), 4),
        "max_s": round(max(rest), 4),
        "cpu_median_s": round(statistics.median(cpus[1:] or cpus), 4),
        "bytes": size,
        "requests": len(rest),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=10, help="requests timed per page (after a first, shown apart)")
    parser.add_argument("--json", action="store_true", help="also print the figures as a RESULT {json} line")
    args = parser.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="interlude-ui-bench-"))
    environment(home)
    from interlude_dev import wiring as dev

    dev.ensure_airflow_db(dict(os.environ), log=home / "migrate.log")
    started = time.perf_counter()
    seed(home, args.runs)
    seeded_s = time.perf_counter() - started

    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    app = create_app()
    with TestClient(app, base_url="http://127.0.0.1") as client:
        token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
        page = timed(client, "/interlude/runs", token, args.repeat)
        rows = client.get("/interlude/runs", headers={"Authorization": f"Bearer {token}"}).text.count('<tr class="run"')
        baseline = timed(client, f"/api/v2/dags/~/dagRuns?limit={args.runs}", token, args.repeat)
    result = {"runs": args.runs, "rows_shown": rows, "seed_s": round(seeded_s, 2), "page": page, "baseline": baseline}
    print(f"Runs page with {args.runs} runs in the metadata DB ({rows} rows shown), {page['requests']} requests each:")
    print(f"{'request':<44} {'first':>8} {'median':>8} {'max':>8} {'CPU med':>8} {'bytes':>9}")
    for name, row in (
        ("Interlude Runs page  /interlude/runs", page),
        ("baseline: Airflow's REST list of the runs", baseline),
    ):
        print(
            f"{name:<44} {row['first_s']:>7.3f}s {row['median_s']:>7.3f}s {row['max_s']:>7.3f}s "
            f"{row['cpu_median_s']:>7.3f}s {row['bytes']:>9}"
        )
    verdict = "met" if page["median_s"] < GOAL_S else "NOT met"
    goal = f"goal: the Runs page answers in under {GOAL_S:.0f} s with {args.runs} runs"
    print(f"{goal}: {verdict} (median {page['median_s']:.3f} s)")
    if args.json:
        print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
