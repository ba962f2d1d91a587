"""One production-shaped Airflow (include/scripts/stack.py) for the stack tests, and a REST client for it (the
`stack` fixture that hands it out is in tests/e2e/conftest.py).

The tests talk to Airflow the way the UI does: a token from SimpleAuthManager (`POST /auth/token`),
then `/api/v2`. Nothing reads the metadata database directly, so what passes here works for a user.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "interlude_training"
BUCKET = "interlude-stack-e2e"
DEFAULT_BUCKET = "interlude-local"  # the DAG's `bucket` param default: the Trigger form as it comes uses it
DATA_DATE = "2024-01-15"  # inside the shipped fine-tuning sample (2024-01-01..2024-03-31)
TERMINAL = {"success", "failed"}
# How often a test asks the REST API about a run it waits for. Each ask costs the stack's api-server 8-50 ms of CPU
# (a run 8, its task instances 20, a filtered list of runs 30-50: measured on an idle stack), and the runs waited for
# take minutes: every 2 s rather than every 0.5-1 s halves what the stack spends answering the tests.
POLL_SECONDS = 2.0


def load_stack_module() -> ModuleType:
    """include/scripts is not a package: load stack.py from its path."""
    spec = importlib.util.spec_from_file_location("interlude_stack", ROOT / "include" / "scripts" / "stack.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AirflowApi:
    """The few /api/v2 calls the tests need, with a token refreshed on 401."""

    def __init__(self, state: dict[str, Any], stack: ModuleType) -> None:
        self.state = state
        self.stack = stack
        self.base = state["base_url"]
        self.session = requests.Session()
        self._login()

    def _login(self) -> None:
        self.session.headers["Authorization"] = f"Bearer {self.stack.api_token(self.state)}"

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        for _ in range(2):
            resp = self.session.request(method, f"{self.base}/api/v2/{path.lstrip('/')}", timeout=30, **kwargs)
            if resp.status_code == 401:
                self._login()
                continue
            break
        assert resp.status_code < 300, f"{method} {path}: {resp.status_code} {resp.text[:500]}"
        return resp.json() if resp.content else None

    def unpause(self, dag_id: str = DAG_ID) -> None:
        self.call("PATCH", f"dags/{dag_id}", json={"is_paused": False})

    def trigger(self, conf: dict[str, Any], dag_id: str = DAG_ID) -> str:
        run = self.call("POST", f"dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        return str(run["dag_run_id"])

    def run(self, run_id: str, dag_id: str = DAG_ID) -> dict[str, Any]:
        return dict(self.call("GET", f"dags/{dag_id}/dagRuns/{run_id}"))

    def task_instances(self, run_id: str, dag_id: str = DAG_ID) -> dict[str, dict[str, Any]]:
        body = self.call("GET", f"dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100})
        return {ti["task_id"]: ti for ti in body["task_instances"]}

    def task_instance(self, run_id: str, task_id: str, dag_id: str = DAG_ID) -> dict[str, Any]:
        return dict(self.call("GET", f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"))

    def active_runs(self, dag_id: str = DAG_ID) -> list[str]:
        """Ids of the DAG's runs that are queued or running."""
        body = self.call("GET", f"dags/{dag_id}/dagRuns", params={"state": ["queued", "running"], "limit": 100})
        return [str(run["dag_run_id"]) for run in body["dag_runs"]]

    def wait_run(
        self,
        run_id: str,
        timeout: float,
        *,
        dag_id: str = DAG_ID,
        until: Callable[[dict[str, Any]], bool] | None = None,
        on_poll: Callable[[dict[str, dict[str, Any]]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the run is terminal (or `until(run)` holds); on_poll sees the task instances."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(run_id, dag_id)
            if on_poll is not None:
                on_poll(self.task_instances(run_id, dag_id))
            if until(run) if until else run["state"] in TERMINAL:
                return run
            if time.monotonic() > deadline:
                states = {t: ti["state"] for t, ti in self.task_instances(run_id, dag_id).items()}
                raise TimeoutError(f"run {run_id} still {run['state']} after {timeout:.0f}s: {states}")
            time.sleep(POLL_SECONDS)


class Stack:
    """A running stack: its state (ports, pids, logs), its REST client, and the local cloud's admin API."""

    def __init__(self, state: dict[str, Any], module: ModuleType) -> None:
        self.state = state
        self.module = module
        self.api = AirflowApi(state, module)

    def log_text(self, name: str) -> str:
        return Path(self.state["logs"][name]).read_text(errors="replace")

    def task_logs(self, run_id: str, task_id: str) -> list[Path]:
        base = (
            Path(self.state["airflow_home"]) / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task_id}"
        )
        return sorted(base.glob("*.log")) if base.exists() else []

    def machines(self) -> list[dict[str, Any]]:
        url = f"{self.state['localcloud']['api_endpoint']}/_localcloud/machines"
        return list(requests.get(url, timeout=30).json()["machines"])

    def restart(self, name: str, env: dict[str, str] | None = None) -> int:
        """SIGKILL one component's process group and start it again (`env`: extra variables, this start only)."""
        return int(self.module.restart_component(self.state, name, env=env))


GPU_ONLY_ZONE = "us-east1-b"


def _scenario(var_dir: Path) -> Path:
    """The default scenario plus a zone that offers GPUs and no TPUs (for the conversion path)."""
    from interlude_dev import scenario

    gpu_only_zone = {
        "region": "us-east1",
        "gpu": {
            "accelerator_types": ["nvidia-h100-80gb", "nvidia-l4"],
            "machine_types": ["a3-highgpu-8g", "g2-standard-8"],
            "capacity": {"nvidia-h100-80gb": {"on_demand": 16, "spot": 16}, "nvidia-l4": {"on_demand": 8}},
        },
    }
    # The serving DAG's cluster (gke_serving_run's: a TPU v6e-1 pool, an L4 pool, the vLLM stand-in), with GKE's TPU
    # fallback wait at the 10 hours the vLLM TPU/GPU recipe warns of: the zones here hold no v6e-1, so a TPU replica
    # never gets a node and what moves it to L4 is Interlude's fallback (tests/e2e/test_zz_interlude_view.py).
    serving = scenario.load("gke_serving_run")
    changes = {
        "zones": {GPU_ONLY_ZONE: gpu_only_zone},
        "regions": {"us-east1": {"quotas": {"NVIDIA_L4_GPUS": 8, "CPUS": 1200}}},
        "gke": serving["gke"],
        "delays": {**serving["delays"], "gke_tpu_fallback_wait": 36000},
    }
    return scenario.build(var_dir / "scenario.yaml", "default", changes)


class StackSession:
    """The session's one stack, started on first use and stopped as soon as no later test needs it.

    Session-scoped fixtures live until the session ends: the stack's PostgreSQL, Redis and five Airflow
    components would then run beside every later test (the fault suite, the unit tests), taking CPU from
    them. `pytest_runtest_teardown` in tests/e2e/conftest.py stops it after the last test of a run of
    stack tests; a later stack test (another order, a subset) starts a fresh one.
    """

    def __init__(self) -> None:
        self.running: Stack | None = None
        self._stop: Callable[[], None] | None = None

    def up(self) -> Stack:
        if self.running is None:
            self.running, self._stop = _start_stack()
        return self.running

    def stop(self) -> None:
        stop, self._stop, self.running = self._stop, None, None
        if stop is not None:
            stop()


def _start_stack() -> tuple[Stack, Callable[[], None]]:
    """Start the stack; return it and its stopper. Every process of it is stopped also when the start fails."""
    module = load_stack_module()
    # Not under pytest's 0700 tmp root: PostgreSQL runs as `postgres` and must reach its data dir.
    # Kept after the session (logs for debugging); one dir per stack under /tmp.
    var_dir = Path(tempfile.mkdtemp(prefix="interlude-stack-"))
    var_dir.chmod(0o711)
    saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")}

    def stop() -> None:
        try:
            state_now = module.read_state(var_dir) or {"pids": {}}
            module.down(var_dir)
            left = {name: pid for name, pid in state_now["pids"].items() if pid and module.group_alive(int(pid))}
            assert not left, f"stack processes survived `down`: {left}"
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    try:
        # DAG files are never edited under a running stack here: parsed once at start, not every 30 s (~2 CPU-s a
        # minute of the stack's life).
        state = module.up(var_dir, bucket=BUCKET, scenario=str(_scenario(var_dir)), reparse_seconds=3600)
        from interlude_dev import wiring as dev

        cloud = dev.LocalCloud(process=None, **state["localcloud"], state_dir=var_dir / "localcloud")  # type: ignore[arg-type]
        dev.ensure_bucket(cloud, DEFAULT_BUCKET)
        os.environ["STORAGE_EMULATOR_HOST"] = state["localcloud"]["gcs_endpoint"]
        os.environ["GOOGLE_CLOUD_PROJECT"] = state["localcloud"]["project"]
        running = Stack(state, module)
        running.api.unpause()
    except BaseException:
        stop()
        raise
    return running, stop


STACK_SESSION = pytest.StashKey[StackSession]()


def stop_stack_unless_next_needs_it(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After a stack test: stop the stack unless the next test uses it too (see StackSession)."""
    holder = item.config.stash.get(STACK_SESSION, None)
    if holder is None or holder.running is None:
        return
    if nextitem is not None and "stack_session" in getattr(nextitem, "fixturenames", ()):
        return
    holder.stop()
