"""Run Interlude on the local cloud: start it, point Airflow at it, run a DAG. Used by `make demo` and tests.

Nothing here is needed in production; it is the one place that knows how the local pieces are wired
(ports, environment, the Airflow connection), so the demo and the end-to-end tests cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from interlude_dev import warm_cli
from interlude_workload import layout

ROOT = Path(__file__).resolve().parents[3]
SCENARIOS = Path(str(resources.files("interlude_localcloud") / "scenarios"))


@dataclass
class LocalCloud:
    process: subprocess.Popen[str]
    api_endpoint: str
    gcs_endpoint: str
    project: str
    state_dir: Path
    container_endpoint: str = ""  # GKE's Container API (same server as TPU/Compute)
    time_scale: float = 1.0  # the scenario's clock: Google-real seconds / time_scale = real seconds

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    @property
    def admin(self) -> Any:
        """The local cloud's admin client (events, machines, faults, preemption, crashes)."""
        from interlude_localcloud.testing import Admin

        return Admin(self.api_endpoint)


def bytecode_cached(env: Mapping[str, str]) -> dict[str, str]:
    """env without PYTHONDONTWRITEBYTECODE: with it, every process started here (Airflow, the local cloud and
    the agents its machines start) compiles Airflow, the Google clients and numpy from source at every start
    (~0.6-0.9 s more per agent start, ~12 s per `dags test`). Bytecode cached once is reused."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}


def start_localcloud(scenario: str | Path, state_dir: Path, port: int = 0, gcs_port: int = 0) -> LocalCloud:
    """Start `python -m interlude_localcloud` and wait for its ready line."""
    scenario_path = Path(scenario)
    if not scenario_path.exists():
        scenario_path = SCENARIOS / f"{scenario}.yaml"
    state_dir.mkdir(parents=True, exist_ok=True)
    log = open(state_dir / "localcloud.log", "a")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "interlude_localcloud",
            "--port",
            str(port),
            "--gcs-port",
            str(gcs_port),
            "--scenario",
            str(scenario_path),
            "--state-dir",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        env=bytecode_cached(os.environ),
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                raise RuntimeError(f"local cloud exited with {proc.returncode}; see {state_dir / 'localcloud.log'}")
            continue
        try:
            ready = json.loads(line)
        except json.JSONDecodeError:
            continue
        if ready.get("ready"):
            project = ready.get("project", "interlude-local")
            return LocalCloud(
                proc,
                ready["api_endpoint"],
                ready["gcs_endpoint"],
                project,
                state_dir,
                ready.get("container_endpoint", ready["api_endpoint"]),
                float(ready.get("time_scale", 1.0)),
            )
    proc.kill()
    raise RuntimeError("local cloud did not report ready within 60 s")


def connection_extra(
    project: str, api_endpoint: str, container_endpoint: str = "", time_scale: float = 1.0
) -> dict[str, Any]:
    """The `google_cloud_default` extras that point every hook at the local cloud (anonymous), with its
    clock (``time_scale``: Google-real seconds per real second)."""
    return {
        "is_anonymous": True,
        "project": project,
        "tpu_endpoint": api_endpoint,
        "compute_endpoint": api_endpoint,
        "container_endpoint": container_endpoint or api_endpoint,
        "time_scale": time_scale,
    }


TRIGGERER_ENV: dict[str, str] = {"MALLOC_ARENA_MAX": "2"}
"""What the triggerer process runs with beside the common Airflow environment (docker-compose.yaml's
``airflow-triggerer`` sets the same; the local stack and the benchmark take it from here). glibc gives the
threads of a process up to 8 malloc arenas per core and keeps freed memory in each; the trigger runner's
event loop, its executor threads and the shared GCS listing's thread each grew one. Two arenas: 98 instead of
112 MB above an idle triggerer watching 1,000 stages in one benchmark run each (benchmarks/README.md); the
runner's threads barely contend for malloc. https://man7.org/linux/man-pages/man3/mallopt.3.html (M_ARENA_MAX)"""


def airflow_env(home: Path, cloud: LocalCloud) -> dict[str, str]:
    """Environment for every Airflow process that should use the local cloud."""
    conn = {
        "conn_type": "google_cloud_platform",
        "extra": connection_extra(
            cloud.project,
            cloud.api_endpoint,
            getattr(cloud, "container_endpoint", ""),
            getattr(cloud, "time_scale", 1.0),
        ),
    }
    env = bytecode_cached(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": json.dumps(conn),
            "STORAGE_EMULATOR_HOST": cloud.gcs_endpoint,
            "GOOGLE_CLOUD_PROJECT": cloud.project,
            "NO_PROXY": "127.0.0.1,localhost",
        }
    )
    return env


def gcs_client(cloud: LocalCloud) -> Any:
    """A storage client for the local cloud's GCS emulator (anonymous, explicit endpoint)."""
    from interlude_workload.gcs import storage_client

    return storage_client(project=cloud.project, emulator=cloud.gcs_endpoint)


def ensure_bucket(cloud: LocalCloud, bucket: str) -> None:
    from google.api_core.exceptions import Conflict

    try:
        gcs_client(cloud).create_bucket(bucket)
    except Conflict:
        pass


# A migrated SQLite metadata DB to copy instead of running `airflow db migrate` (~4 CPU-s) for a new home: the
# test suite migrates one per run and names it here for the benchmarks and demos its tests start.
DB_TEMPLATE_ENV = "INTERLUDE_AIRFLOW_DB_TEMPLATE"


def ensure_airflow_db(env: dict[str, str], log: Path | None = None) -> None:
    """A migrated metadata DB in the home: kept if there is one, else a copy of DB_TEMPLATE_ENV's, else migrated
    (the migration's output appended to `log`, if given)."""
    home = Path(env["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    if (home / "airflow.db").exists():
        return
    template = env.get(DB_TEMPLATE_ENV)
    if template and Path(template).is_file():
        shutil.copy(template, home / "airflow.db")
        return
    # A new `airflow` process, or a child of the test suite's warm server (warm_cli): the same command either way.
    warm_cli.check_airflow(["db", "migrate"], env, log, timeout=300)


@dataclass
class DagTestResult:
    returncode: int
    run_id: str | None
    state: str | None
    log: str
    tasks: dict[str, str | None] = field(default_factory=dict)  # task_id -> state, when read from the DB

    @property
    def succeeded(self) -> bool:
        return self.state == "success"


_FINISHED = re.compile(r"DagRun Finished: dag_id=(?P<dag>[^,]+), .*?run_id=(?P<run>[^,]+), .*?state=(?P<state>\w+)")


def dags_test(
    env: dict[str, str], dag_id: str, conf: dict[str, Any], log_path: Path, timeout: float = 900
) -> DagTestResult:
    """`airflow dags test` with conf; output to log_path. The run's state is read from Airflow's own
    closing line ("DagRun Finished: ... state=..."), which says more than the exit code."""
    rc = warm_cli.run_airflow(["dags", "test", dag_id, "--conf", json.dumps(conf)], env, log_path, timeout)
    text = log_path.read_text(errors="replace")
    found = [m for m in _FINISHED.finditer(text) if m["dag"] == dag_id]
    last = found[-1] if found else None
    return DagTestResult(rc, last["run"] if last else None, last["state"] if last else None, text)


def read_report(cloud: LocalCloud, bucket: str, run_key: str) -> dict[str, Any] | None:
    blob = gcs_client(cloud).bucket(bucket).get_blob(layout.report_object(run_key))
    return json.loads(blob.download_as_bytes()) if blob else None


def machines(cloud: LocalCloud) -> list[dict[str, Any]]:
    """Every node and VM the local cloud holds right now (its admin view)."""
    return list(cloud.admin.machines())


# Reference digests computed in this process, by the inputs that decide them (see _reference_inputs).
_REFERENCE_DIGESTS: dict[tuple[int, int, int, int, str, str], str] = {}


def _reference_inputs(conf: dict[str, Any]) -> tuple[int, int, int, int, str, str]:
    """What an uninterrupted run's final weights depend on: steps per stage, checkpoint interval, seed, the
    fine-tuning day and the model's size. Not the cloud, the bucket or the pacing (``step_seconds``)."""
    return (
        int(conf["train_steps"]),
        int(conf["finetune_steps"]),
        int(conf["checkpoint_every"]),
        int(conf.get("seed", 0)),
        str(conf["data_date"]),
        str(conf.get("model_size", "small")),
    )


def reference_digest(cloud: LocalCloud, bucket: str, conf: dict[str, Any], run_key: str | None = None) -> str:
    """Train + fine-tune uninterrupted on this machine (same seed, data, steps), return the final digest.

    The yardstick for "resumed runs lose nothing": a run that went through maintenance must end with
    exactly these weights. The weights are a function of the inputs alone, so each set of inputs is
    trained once per process (a test session asks for the same few again and again), under a run key of
    its own: a reference for other inputs never resumes from these checkpoints.
    """
    inputs = _reference_inputs(conf)
    if inputs not in _REFERENCE_DIGESTS:
        key = run_key or reference_run_key(conf)
        _REFERENCE_DIGESTS[inputs] = _train_reference(cloud, bucket, conf, key)
    return _REFERENCE_DIGESTS[inputs]


def reference_run_key(conf: dict[str, Any]) -> str:
    """The run key the uninterrupted reference run of these inputs is trained under."""
    return "reference-" + "-".join(str(part) for part in _reference_inputs(conf))


def reference_checkpoints(cloud: LocalCloud, bucket: str, conf: dict[str, Any]) -> str:
    """The reference run's key, its checkpoints trained in THIS cloud if they are not there yet.

    The digest cache is per process, but a test's local cloud (and its GCS) may be new: a test that reads the
    reference's weights, not only its digest, needs them in its own bucket."""
    from interlude_workload.checkpoints import CheckpointStore

    key = reference_run_key(conf)
    if CheckpointStore(bucket, key, "finetune", client=gcs_client(cloud)).latest().checkpoint is None:
        _REFERENCE_DIGESTS[_reference_inputs(conf)] = _train_reference(cloud, bucket, conf, key)
    return key


def _train_reference(cloud: LocalCloud, bucket: str, conf: dict[str, Any], run_key: str) -> str:
    from interlude_workload.checkpoints import CheckpointStore

    env = {**os.environ, "STORAGE_EMULATOR_HOST": cloud.gcs_endpoint}
    common = [
        "--bucket",
        bucket,
        "--run-key",
        run_key,
        "--checkpoint-every",
        str(conf["checkpoint_every"]),
        "--seed",
        str(conf.get("seed", 0)),
        "--model-size",
        str(conf.get("model_size", "small")),
    ]
    stages: tuple[tuple[str, int, list[str]], ...] = (
        ("train", conf["train_steps"], []),
        ("finetune", conf["finetune_steps"], ["--init-from-stage", "train", "--data-date", conf["data_date"]]),
    )
    for stage, steps, extra in stages:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "interlude_workload.train",
                *common,
                "--stage",
                stage,
                "--steps",
                str(steps),
                *extra,
            ],
            env=env,
            check=True,
            capture_output=True,
            timeout=300,
        )
    store = CheckpointStore(bucket, run_key, "finetune", client=gcs_client(cloud))
    return str(store.latest().checkpoint.metrics["digest"])
