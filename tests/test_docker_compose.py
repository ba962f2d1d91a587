"""docker-compose.yaml: valid for Compose, the official Airflow topology plus the local cloud, 127.0.0.1 only.

There is no Docker engine here; Debian's `docker-compose` (v1) still parses, merges the YAML anchors and
validates the file against the Compose schema (`config -q`), which is what breaks first when the file drifts.
In CI (`CI=true`, as GitHub Actions sets it) a docker-compose that cannot be had fails the tests: a skip there
would turn a broken install into a green run. Elsewhere it skips, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from interlude_dev import apt

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yaml"
SERVICES = {
    "postgres",
    "redis",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
    "airflow-init",
    "localcloud",
}


def in_ci() -> bool:
    """GitHub Actions (and most CI services) set CI=true."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def unavailable(reason: str) -> NoReturn:
    """Fail in CI (the install is part of what CI checks), skip with the reason elsewhere."""
    if in_ci():
        pytest.fail(f"CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def docker_compose() -> str:
    """Debian's docker-compose, installed with apt-get when missing and we may (root); else see `unavailable`."""
    try:  # nothing to install when it is there already
        apt.ensure({"docker-compose": lambda: bool(shutil.which("docker-compose"))})
    except apt.CannotInstall as err:
        unavailable(f"docker-compose is not installed and apt-get cannot run here: {err}")
    except subprocess.CalledProcessError as err:
        unavailable(f"could not install docker-compose: `{' '.join(err.cmd)}` exited {err.returncode}")
    return shutil.which("docker-compose") or unavailable("docker-compose still missing after apt-get install")


def compose(exe: str, env_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`docker-compose` on our file with only `env_file` for variables (never the developer's `.env`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW_", "INTERLUDE_", "POSTGRES_"))}
    return subprocess.run(
        [exe, "--env-file", str(env_file), "-f", str(COMPOSE), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )


@pytest.fixture(scope="module")
def resolved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The file as Compose sees it: anchors merged, variables substituted, schema-checked.

    With the secrets `stack.py compose-env` makes (the file refuses to start without them).
    """
    from tests.e2e.stack_fixtures import load_stack_module

    exe = docker_compose()
    env_file = tmp_path_factory.mktemp("compose") / ".env"
    assert load_stack_module().compose_env(env_file)
    check = compose(exe, env_file, "config", "-q")
    assert check.returncode == 0, check.stderr
    out = compose(exe, env_file, "config")
    assert out.returncode == 0, out.stderr
    return dict(yaml.safe_load(out.stdout))


def test_has_the_official_topology_and_the_local_cloud(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == SERVICES


def test_published_ports_bind_localhost_only(resolved: dict[str, Any]) -> None:
    published = 0
    for name, service in resolved["services"].items():
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).rsplit(":", 2)[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond 127.0.0.1"
            published += 1
    assert published >= 1
    assert "ports" in resolved["services"]["airflow-apiserver"]


def test_airflow_components_share_one_configuration(resolved: dict[str, Any]) -> None:
    """Same executor, database, broker and JWT secret for every component: multi-process Airflow needs it."""
    airflow = {n: s for n, s in resolved["services"].items() if n.startswith("airflow-")}
    keys = (
        "AIRFLOW__CORE__EXECUTOR",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
        "AIRFLOW__CELERY__BROKER_URL",
        "AIRFLOW__API_AUTH__JWT_SECRET",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL",
        "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS",
    )
    for key in keys:
        values = {n: s["environment"].get(key) for n, s in airflow.items()}
        assert len(set(values.values())) == 1 and None not in values.values(), (key, values)
    assert airflow["airflow-worker"]["environment"]["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    commands = {n: " ".join(s["command"]) for n, s in airflow.items()}
    assert commands["airflow-worker"].startswith("airflow celery worker")
    assert commands["airflow-triggerer"].startswith("airflow triggerer")
    assert "interlude_localcloud" in " ".join(resolved["services"]["localcloud"]["command"])


def test_components_calling_the_local_cloud_can_reach_it(resolved: dict[str, Any]) -> None:
    """The local cloud binds 127.0.0.1: the worker and triggerer must share its network namespace."""
    for name in ("airflow-worker", "airflow-triggerer"):
        assert resolved["services"][name].get("network_mode") == "service:localcloud", name
        assert resolved["services"][name]["environment"]["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:")


def test_the_triggerer_runs_with_the_documented_environment(resolved: dict[str, Any]) -> None:
    """docker-compose's triggerer and the local stack's take the same extra settings (MALLOC_ARENA_MAX)."""
    from interlude_dev.wiring import TRIGGERER_ENV

    env = resolved["services"]["airflow-triggerer"]["environment"]
    assert {k: env.get(k) for k in TRIGGERER_ENV} == TRIGGERER_ENV
    assert (
        env["AIRFLOW__CORE__EXECUTOR"]
        == resolved["services"]["airflow-scheduler"]["environment"]["AIRFLOW__CORE__EXECUTOR"]
    )


def _outcome(call: Any) -> BaseException | None:
    """What `call()` raised, pytest's skip and fail included (they are BaseExceptions)."""
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the outcome is the thing under test
        return exc
    return None


@pytest.mark.parametrize("ci", ["true", ""])
@pytest.mark.parametrize("apt_get", ["exit 100", None])  # apt-get fails (no mirror) | there is no apt-get at all
def test_a_docker_compose_that_cannot_be_installed_fails_in_ci_and_skips_with_the_reason_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci: str, apt_get: str | None
) -> None:
    """A real `apt-get` process that fails (a stand-in first on PATH: a real install would change this machine),
    or none on PATH; docker-compose absent either way."""
    if apt_get is not None:
        stand_in = tmp_path / "apt-get"
        stand_in.write_text(f"#!/bin/sh\n{apt_get}\n")
        stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    if os.geteuid() != 0 and apt_get is not None:
        pytest.skip("apt.ensure runs apt-get only as root")
    outcome = _outcome(docker_compose)
    expected = pytest.fail.Exception if ci else pytest.skip.Exception
    assert type(outcome) is expected, repr(outcome)
    assert ("exited 100" if apt_get else "apt-get cannot run here") in str(outcome), outcome
