"""A production-shaped Airflow on one machine: PostgreSQL, Redis, Celery, every component its own process.

`airflow standalone` and `airflow dags test` hide what breaks in production: triggers that only import
in the test process, workers without the Execution API, state that only lives in SQLite. This script
runs the real topology on 127.0.0.1 so the end-to-end tests (and a curious user) can exercise it:

    python include/scripts/stack.py up [--var-dir var/stack] [--scenario default]
    python include/scripts/stack.py status [--var-dir var/stack]
    python include/scripts/stack.py down [--var-dir var/stack]
    python include/scripts/stack.py compose-env [--env-file .env]   # secrets for docker-compose.yaml

`up` installs PostgreSQL 15 and Redis with apt-get when they are missing (root only), starts its own
PostgreSQL cluster and redis-server (never the system ones), writes one airflow.cfg shared by all
components, migrates the database, starts the local cloud, api-server, scheduler, dag-processor,
triggerer and a Celery worker, and writes `stack.json` (ports, pids, REST base url, credentials) once
the api-server answers and the lifecycle DAG is parsed. `down` stops what `stack.json` lists (process
groups: SIGTERM, then SIGKILL) and stops PostgreSQL with pg_ctl. Nothing is deleted.

Importable too: `up(var_dir) -> dict` and `down(var_dir)`; the e2e tests use it that way.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "interlude_training"
STATE_FILE = "stack.json"
ADMIN_USER = "admin"
# A user who may log in and read nothing (SimpleAuthManager with no role): what the Interlude view must refuse (403).
OUTSIDER_USER = "outsider"
# Components in start order; `down` stops them in reverse.
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer", "worker")
sys.path.insert(0, str(ROOT / "plugins"))  # `interlude` without an installed package (CLI from a checkout)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # stack_postgres, stack_processes: beside this file

# Re-exported: the tests and the secrets check reach PostgreSQL and the processes through this module.
from stack_postgres import PG_BIN as PG_BIN  # noqa: E402
from stack_postgres import (  # noqa: E402
    db_password,
    ensure_packages,
    start_postgres,
    stop_postgres,
    write_secret,
)
from stack_processes import free_port, group_alive, log, pid_alive, reap, spawn, start_time, stop_group, stop_groups  # noqa: E402

ACCELERATOR_POOL = "interlude_accelerators"  # the DAG's tasks that hold a machine run in it


def airflow_bin() -> str:
    """The `airflow` next to this interpreter (the project venv), else the one on PATH."""
    candidate = Path(sys.executable).parent / "airflow"
    return str(candidate) if candidate.exists() else (shutil.which("airflow") or "airflow")


def restart_component(
    state: dict[str, Any], name: str, kill_signal: int = signal.SIGKILL, env: dict[str, str] | None = None
) -> int:
    """Kill one component's process group and start it again (same command, env, log). Returns the new pid.

    `env` adds variables for this start only (a later restart without it goes back to the stack's own).
    """
    pid = int(state["pids"][name])
    if kill_signal == signal.SIGKILL:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while group_alive(pid) and time.monotonic() < deadline:
            reap(pid)
            time.sleep(0.1)
    else:
        stop_group(pid, state["started"].get(name))
    var_dir = Path(state["var_dir"])
    proc = spawn(name, state["commands"][name], component_env(state) | (env or {}), var_dir / "logs")
    state["pids"][name] = proc.pid
    state["started"][name] = start_time(proc.pid)
    write_state(var_dir, state)
    return proc.pid


# ---------------------------------------------------------------------------------------------- config
def write_airflow_cfg(
    home: Path,
    *,
    pg_port: int,
    redis_port: int,
    api_port: int,
    secret: str,
    jwt_secret: str,
    fernet_key: str,
    password_file: Path,
    db_password: str,
    max_machines: int = 2,
    reparse_seconds: int = 30,
) -> Path:
    """The one airflow.cfg every component reads (same secrets, same database, same broker); mode 0600."""
    db = f"postgresql+psycopg2://airflow:{db_password}@127.0.0.1:{pg_port}/airflow"
    sections: dict[str, dict[str, Any]] = {
        "core": {
            "executor": "CeleryExecutor",
            "dags_folder": ROOT / "dags",
            "plugins_folder": ROOT / "plugins",
            "load_examples": "False",
            "parallelism": 8,
            "max_active_tasks_per_dag": 8,
            "fernet_key": fernet_key,
            "execution_api_server_url": f"http://127.0.0.1:{api_port}/execution/",
            "auth_manager": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
            "simple_auth_manager_users": f"{ADMIN_USER}:admin,{OUTSIDER_USER}:",
            "simple_auth_manager_passwords_file": password_file,
        },
        "database": {"sql_alchemy_conn": db},
        "celery": {
            "broker_url": f"redis://127.0.0.1:{redis_port}/0",
            "result_backend": f"db+postgresql://airflow:{db_password}@127.0.0.1:{pg_port}/airflow",
            "worker_concurrency": 4,
            # Interlude's clients imported once per worker, not once per task (interlude.deploy.worker_preload).
            "celery_config_options": "interlude.deploy.celery_config.CELERY_CONFIG",
        },
        "api": {
            "host": "127.0.0.1",
            "port": api_port,
            "secret_key": secret,
            "workers": 1,
            "base_url": f"http://127.0.0.1:{api_port}/",
        },
        "api_auth": {"jwt_secret": jwt_secret},
        "logging": {
            "base_log_folder": home / "logs",
            "worker_log_server_port": free_port(),
            "trigger_log_server_port": free_port(),
        },
        "scheduler": {"standalone_dag_processor": "True"},
        # Each DAG file is parsed again every `reparse_seconds` (Airflow's default 30 s: an edited DAG shows soon).
        "dag_processor": {"refresh_interval": 30, "min_file_process_interval": reparse_seconds},
        # A killed triggerer's triggers move to a live one after the health threshold: keep it short locally.
        "triggerer": {"capacity": 1000, "job_heartbeat_sec": 2, "triggerer_health_check_threshold": 10},
        # Machines alive at once (interlude.machines.slots): the same number as the accelerator pool's slots.
        "interlude": {"max_machines": max_machines},
    }
    home.mkdir(parents=True, exist_ok=True)
    lines = []
    for section, options in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {value}" for key, value in options.items()]
        lines.append("")
    return write_secret(home / "airflow.cfg", "\n".join(lines))


def jwt_secret() -> str:
    """A key as long as HS512's digest (64 bytes; Airflow signs with HS512 given jwt_secret), so PyJWT
    raises no InsecureKeyLengthWarning (RFC 7518 section 3.2: key size >= hash output size)."""
    return secrets.token_urlsafe(64)  # 86 characters of base64url = 64 random bytes


def component_env(state: dict[str, Any]) -> dict[str, str]:
    """dev.airflow_env (connection, STORAGE_EMULATOR_HOST) minus stray AIRFLOW__* from the caller's shell."""
    from interlude_dev import wiring as dev

    cloud = dev.LocalCloud(
        process=None,
        api_endpoint=state["localcloud"]["api_endpoint"],  # type: ignore[arg-type]
        gcs_endpoint=state["localcloud"]["gcs_endpoint"],
        project=state["localcloud"]["project"],
        state_dir=Path(state["var_dir"]) / "localcloud",
        time_scale=float(state["localcloud"].get("time_scale", 1.0)),
    )
    env = dev.airflow_env(Path(state["airflow_home"]), cloud)
    keep = {
        "AIRFLOW__CORE__DAGS_FOLDER",
        "AIRFLOW__CORE__PLUGINS_FOLDER",
        "AIRFLOW__CORE__LOAD_EXAMPLES",
        "AIRFLOW__CORE__UNIT_TEST_MODE",
        "AIRFLOW__API__HOST",
    }
    env = {k: v for k, v in env.items() if not k.startswith("AIRFLOW__") or k in keep}
    env["AIRFLOW_CONFIG"] = str(Path(state["airflow_home"]) / "airflow.cfg")
    env["PYTHONUNBUFFERED"] = "1"
    # The venv's bin first: Celery forks `airflow` task runners; the local cloud's machines need `python`.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


# ---------------------------------------------------------------------------------------------- local cloud
def start_localcloud(scenario: str, state_dir: Path, port: int) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """`python -m interlude_localcloud`, its ready line read from a file (not a pipe: it outlives `up`)."""
    from interlude_dev import wiring as dev

    scenario_path = Path(scenario)
    if not scenario_path.exists():
        scenario_path = dev.SCENARIOS / f"{scenario}.yaml"
    state_dir.mkdir(parents=True, exist_ok=True)
    ready_file = state_dir / "ready.jsonl"
    ready_file.write_text("")
    with open(ready_file, "ab") as out, open(state_dir / "localcloud.log", "ab") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "interlude_localcloud",
                "--port",
                str(port),
                "--gcs-port",
                str(free_port()),
                "--scenario",
                str(scenario_path),
                "--state-dir",
                str(state_dir),
            ],
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(ROOT),
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in ready_file.read_text().splitlines():
            try:
                ready = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ready.get("ready"):
                return proc, {
                    "api_endpoint": ready["api_endpoint"],
                    "gcs_endpoint": ready["gcs_endpoint"],
                    "project": ready.get("project", "interlude-local"),
                    "time_scale": float(ready.get("time_scale", 1.0)),
                }
        if proc.poll() is not None:
            raise RuntimeError(f"local cloud exited with {proc.returncode}; see {state_dir / 'localcloud.log'}")
        time.sleep(0.2)
    stop_group(proc.pid)
    raise RuntimeError("local cloud did not report ready within 60 s")


# ---------------------------------------------------------------------------------------------- state
def write_state(var_dir: Path, state: dict[str, Any]) -> None:
    """stack.json holds the admin password: 0600 like every file with a secret."""
    write_secret(var_dir / STATE_FILE, json.dumps(state, indent=2, sort_keys=True))


def read_state(var_dir: Path) -> dict[str, Any] | None:
    path = var_dir / STATE_FILE
    return json.loads(path.read_text()) if path.exists() else None


def api_token(state: dict[str, Any], user: str = "auth") -> str:
    """A JWT from SimpleAuthManager, the way the UI logs in (`user`: the state's "auth" (admin) or "outsider")."""
    import requests

    auth = state[user]
    resp = requests.post(
        f"{state['base_url']}/auth/token", json={"username": auth["username"], "password": auth["password"]}, timeout=30
    )
    resp.raise_for_status()
    return str(resp.json()["access_token"])


def _warm_execution_api(state: dict[str, Any], procs: dict[str, subprocess.Popen[bytes]], timeout: float) -> None:
    """Until the api-server's Execution API answers; only then may a worker start tasks.

    The api-server builds its /execution sub-application on the first request to it, which takes
    seconds (5.5 s measured on a loaded 2-core machine). A worker's first task-start call landing on a
    cold server outran the Task SDK's 5 s `[workers] execution_api_timeout` and was retried; warming the
    Execution API before the worker exists removes that first slow call from every task.
    """
    import requests

    url = f"{state['base_url']}/execution/health"
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        code = procs["api-server"].poll()
        if code is not None:
            raise RuntimeError(f"api-server exited with {code}; see {state['logs']['api-server']}")
        try:
            if requests.get(url, timeout=60).status_code == 200:
                log(f"execution API warm after {time.monotonic() - started:.1f}s")
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"the api-server's Execution API did not answer within {timeout:.0f}s")


def _wait_ready(state: dict[str, Any], procs: dict[str, subprocess.Popen[bytes]], timeout: float) -> None:
    """Until the api-server answers, logs us in, and shows the DAG parsed without import errors."""
    import requests

    base = state["base_url"]
    deadline = time.monotonic() + timeout
    stage = "api-server health"
    token = None
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; see {state['logs'][name]}")
        try:
            if token is None:
                if requests.get(f"{base}/api/v2/monitor/health", timeout=5).status_code != 200:
                    raise OSError("not healthy yet")
                stage = "DAG parsed"
                token = api_token(state)
            resp = requests.get(
                f"{base}/api/v2/dags/{DAG_ID}", headers={"Authorization": f"Bearer {token}"}, timeout=10
            )
            if resp.status_code == 200:
                errors = requests.get(
                    f"{base}/api/v2/importErrors", headers={"Authorization": f"Bearer {token}"}, timeout=10
                ).json()
                if errors.get("total_entries"):
                    raise RuntimeError(f"DAG import errors: {errors['import_errors']}")
                return
        except (OSError, requests.RequestException):
            pass
        time.sleep(1)
    raise TimeoutError(f"stack not ready after {timeout:.0f}s (waiting for {stage}); logs in {state['var_dir']}/logs")


# ---------------------------------------------------------------------------------------------- up / down
def up(
    var_dir: Path,
    *,
    scenario: str = "default",
    pool_slots: int = 2,
    pg_port: int = 0,
    redis_port: int = 0,
    api_port: int = 0,
    localcloud_port: int = 0,
    bucket: str = "interlude-local",
    timeout: float = 180.0,
    reparse_seconds: int = 30,
) -> dict[str, Any]:
    """Start everything; return (and write) the state. On failure, stop what was started and raise.

    `reparse_seconds`: how often the dag-processor parses each DAG file again (the test suite, which never edits
    one under a running stack, sets it long: each pass of the three files cost ~1.5 CPU-s)."""
    from interlude_dev import warm_cli
    from interlude_dev import wiring as dev

    var_dir = var_dir.resolve()
    existing = read_state(var_dir)
    if existing and any(pid_alive(int(p)) for p in existing["pids"].values()):
        raise RuntimeError(f"a stack is already running from {var_dir} (pids {existing['pids']}); `down` it first")
    ensure_packages()
    var_dir.mkdir(parents=True, exist_ok=True)
    home, logs = var_dir / "airflow", var_dir / "logs"
    redis_port = redis_port or free_port()
    api_port, localcloud_port = api_port or free_port(), localcloud_port or free_port()
    password, outsider_password = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    state: dict[str, Any] = {
        "var_dir": str(var_dir),
        "airflow_home": str(home),
        "dag_id": DAG_ID,
        "bucket": bucket,
        "ports": {"postgres": None, "redis": redis_port, "api": api_port, "localcloud": localcloud_port},
        "base_url": f"http://127.0.0.1:{api_port}",
        "auth": {"username": ADMIN_USER, "password": password, "token_url": f"http://127.0.0.1:{api_port}/auth/token"},
        "outsider": {"username": OUTSIDER_USER, "password": outsider_password},
        "pids": {},
        "started": {},
        "commands": {},
        "logs": {},
        "postgres_dir": str(var_dir / "postgres"),
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        pg_port = state["ports"]["postgres"] = start_postgres(var_dir / "postgres", pg_port, db_password(var_dir))
        log(f"postgres on 127.0.0.1:{pg_port}")
        log(f"redis on 127.0.0.1:{redis_port}")
        (var_dir / "redis").mkdir(exist_ok=True)
        redis_cmd = [
            "redis-server",
            "--bind",
            "127.0.0.1",
            "--port",
            str(redis_port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "yes",
            "--dir",
            str(var_dir / "redis"),
        ]
        procs["redis"] = spawn("redis", redis_cmd, dict(os.environ), logs)
        state["pids"]["redis"] = procs["redis"].pid
        state["started"]["redis"] = start_time(procs["redis"].pid)
        log(f"local cloud on 127.0.0.1:{localcloud_port} ({scenario})")
        cloud_proc, state["localcloud"] = start_localcloud(scenario, var_dir / "localcloud", localcloud_port)
        procs["localcloud"] = cloud_proc
        state["pids"]["localcloud"] = cloud_proc.pid
        state["started"]["localcloud"] = start_time(cloud_proc.pid)
        write_state(var_dir, state)

        password_file = home / "simple_auth_manager_passwords.json"
        home.mkdir(parents=True, exist_ok=True)
        write_secret(password_file, json.dumps({ADMIN_USER: password, OUTSIDER_USER: outsider_password}))
        from cryptography.fernet import Fernet

        write_airflow_cfg(
            home,
            pg_port=pg_port,
            redis_port=redis_port,
            api_port=api_port,
            secret=secrets.token_urlsafe(32),
            jwt_secret=jwt_secret(),
            fernet_key=Fernet.generate_key().decode(),
            password_file=password_file,
            db_password=db_password(var_dir),
            max_machines=pool_slots,
            reparse_seconds=reparse_seconds,
        )
        env = component_env(state)
        log("airflow db migrate")
        # These two commands: new `airflow` processes, or children of the test suite's warm server when a test
        # starts the stack (warm_cli: the same command either way, ~4 CPU-s less each).
        code = warm_cli.run_airflow(["db", "migrate"], env, logs / "db-migrate.log", timeout=timeout)
        if code != 0:
            raise RuntimeError(f"`airflow db migrate` failed (exit {code}); see {logs / 'db-migrate.log'}")
        # The pool stands for accelerator quota: deferred tasks (a stage waiting on its machine) hold it.
        # Set while the components start (each is an Airflow process start-up of several seconds).
        pool_argv = ["pools", "set", ACCELERATOR_POOL, str(pool_slots), "Accelerators Interlude may hold at once"]
        pool_set = warm_cli.start_airflow([*pool_argv, "--include-deferred"], env, logs / "pools-set.log")
        dev.ensure_bucket(
            dev.LocalCloud(process=None, **state["localcloud"], state_dir=var_dir / "localcloud"),  # type: ignore[arg-type]
            bucket,
        )
        af = airflow_bin()
        commands = {
            "api-server": [af, "api-server", "--host", "127.0.0.1", "--port", str(api_port)],
            "scheduler": [af, "scheduler", "--skip-serve-logs"],
            "dag-processor": [af, "dag-processor"],
            "triggerer": [af, "triggerer", "--skip-serve-logs"],
            "worker": [af, "celery", "worker", "--skip-serve-logs", "--concurrency", "4", "--queues", "default"],
        }
        # All at once: nothing runs a task before `up` returns, so the scheduler and the worker need not wait
        # for the api-server; its Execution API is warmed before `up` returns (the first task start is warm).
        for name, cmd in commands.items():
            log(f"starting {name}")
            procs[name] = spawn(name, cmd, {**env, **dev.TRIGGERER_ENV} if name == "triggerer" else env, logs)
            state["pids"][name] = procs[name].pid
            state["started"][name] = start_time(procs[name].pid)
            state["commands"][name] = cmd
            state["logs"][name] = str(logs / f"{name}.log")
            write_state(var_dir, state)
        _warm_execution_api(state, procs, timeout)
        try:
            code = pool_set.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pool_set.kill()
            raise
        if code != 0:
            raise RuntimeError(f"`airflow pools set` failed (exit {code}); see {logs / 'pools-set.log'}")
        state["logs"].update(
            {
                "redis": str(logs / "redis.log"),
                "localcloud": str(var_dir / "localcloud" / "localcloud.log"),
                "postgres": str(var_dir / "postgres" / "postgres.log"),
            }
        )
        _wait_ready(state, procs, timeout)
        state["ready_at"] = time.time()
        write_state(var_dir, state)
        log(f"ready: {state['base_url']} (user {ADMIN_USER}; password in {var_dir / STATE_FILE})")
        return state
    except BaseException:
        log("start failed; stopping what was started")
        write_state(var_dir, state)
        down(var_dir)
        raise


def down(var_dir: Path) -> None:
    """Stop every process `up` started (reverse order), then PostgreSQL. Deletes nothing."""
    var_dir = var_dir.resolve()
    state = read_state(var_dir)
    if state is None:
        log(f"no {STATE_FILE} in {var_dir}; nothing to stop")
        return
    started = state.get("started", {})
    # The Airflow components together, then what they talk to while shutting down (the cloud, the broker).
    for names in (tuple(reversed(COMPONENTS)), ("localcloud", "redis")):
        groups = {int(state["pids"][name]): started.get(name) for name in names if state["pids"].get(name)}
        for name in names:
            if state["pids"].get(name):
                log(f"stopping {name} (pid {state['pids'][name]})")
        stop_groups(groups)
    stop_postgres(Path(state["postgres_dir"]))
    state["stopped_at"] = time.time()
    write_state(var_dir, state)
    log("stopped")


def status(var_dir: Path) -> dict[str, Any]:
    state = read_state(var_dir.resolve())
    if state is None:
        return {"running": False}
    alive = {name: pid_alive(int(pid)) for name, pid in state["pids"].items() if pid}
    pg = (Path(state["postgres_dir"]) / "data" / "postmaster.pid").exists()
    return {
        "running": all(alive.values()) and pg,
        "processes": alive,
        "postgres": pg,
        "base_url": state["base_url"],
        "ports": state["ports"],
    }


def compose_env(path: Path) -> bool:
    """Fresh random secrets for docker-compose.yaml in a 0600 `.env`; an existing file is kept (False).

    The compose file ships no secret and refuses to start without these, so nothing default or empty
    (an empty fernet key stores connections in clear) ever reaches a running stack.
    """
    if path.exists():
        return False
    from cryptography.fernet import Fernet

    values = {
        "POSTGRES_PASSWORD": secrets.token_hex(24),
        "AIRFLOW_FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW_JWT_SECRET": jwt_secret(),
        "AIRFLOW_API_SECRET_KEY": secrets.token_urlsafe(32),
    }
    write_secret(path, "".join(f"{k}={v}\n" for k, v in values.items()))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down", "status", "compose-env"])
    parser.add_argument("--env-file", type=Path, default=ROOT / ".env", help="compose-env: where to write")
    parser.add_argument("--var-dir", type=Path, default=ROOT / "var" / "stack")
    parser.add_argument("--scenario", default="default")
    parser.add_argument("--api-port", type=int, default=0)
    parser.add_argument("--postgres-port", type=int, default=0)
    parser.add_argument("--redis-port", type=int, default=0)
    parser.add_argument("--localcloud-port", type=int, default=0)
    parser.add_argument("--bucket", default="interlude-local")
    args = parser.parse_args(argv)
    if args.command == "up":
        state = up(
            args.var_dir,
            scenario=args.scenario,
            pg_port=args.postgres_port,
            redis_port=args.redis_port,
            api_port=args.api_port,
            localcloud_port=args.localcloud_port,
            bucket=args.bucket,
        )
        summary = {k: state[k] for k in ("base_url", "ports", "var_dir")}
        print(json.dumps({**summary, "user": ADMIN_USER, "state": str(args.var_dir / STATE_FILE)}))
    elif args.command == "down":
        down(args.var_dir)
    elif args.command == "compose-env":
        made = compose_env(args.env_file)
        log(f"{'wrote' if made else 'kept the existing'} {args.env_file} (mode 0600)")
    else:
        info = status(args.var_dir)
        print(json.dumps(info, indent=2))
        return 0 if info["running"] else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
