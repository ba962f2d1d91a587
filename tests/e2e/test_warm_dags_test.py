"""The suite runs `airflow dags test` forked from a warm Airflow (interlude_dev.warm_cli): the same run must come out
of it as out of a new `airflow` process, or every end-to-end test would be testing something else."""

from __future__ import annotations

import configparser
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from interlude_dev import warm_cli

if TYPE_CHECKING:  # the fixtures' types; conftest is not importable as a module under importlib mode
    from tests.e2e.conftest import RunDag


SECRETS = {("core", "fernet_key"), ("api_auth", "jwt_secret"), ("api", "secret_key")}


def _config(home: Path) -> dict[tuple[str, str], str]:
    """The airflow.cfg Airflow wrote into the run's own home (a new process writes one when there is none), with
    the home's path written as <home>."""
    parser = configparser.ConfigParser(interpolation=None)
    assert parser.read(home / "airflow.cfg"), f"no airflow.cfg in {home}"
    return {
        (section, key): value.replace(str(home), "<home>")
        for section in parser.sections()
        for key, value in parser.items(section)
    }


def test_a_warm_dags_test_runs_as_a_new_process_does(
    run_dag: RunDag, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(warm_cli.SWITCH_ENV, "0")
    cold = run_dag("default", {"plan_only": True})
    monkeypatch.setenv(warm_cli.SWITCH_ENV, "1")
    warm = run_dag("default", {"plan_only": True})

    assert (cold.state, cold.exit_code) == ("success", 0), cold.log[-3000:]
    assert (warm.state, warm.exit_code) == (cold.state, cold.exit_code), warm.log[-3000:]
    assert warm.states == cold.states
    plan = "Plan only: would provision v6e-8 in us-central1-a with runtime v2-alpha-tpuv6e"
    assert plan in cold.log and plan in warm.log
    assert warm.machines() == cold.machines() == []
    # Each run used its own home (run_dag read each run's state from that home's DB) and wrote the same
    # airflow.cfg there, paths made from that home (a later cold command in the home reads it), with keys of
    # its own.
    cold_cfg, warm_cfg = _config(tmp_path / "airflow-1"), _config(tmp_path / "airflow-2")
    assert warm_cfg[("database", "sql_alchemy_conn")] == "sqlite:///<home>/airflow.db"
    assert {k: v for k, v in warm_cfg.items() if k not in SECRETS} == {
        k: v for k, v in cold_cfg.items() if k not in SECRETS
    }
    for key in SECRETS & set(cold_cfg):
        assert warm_cfg[key] and warm_cfg[key] != cold_cfg[key], key
