"""interlude_dev.wiring's reference digest: trained once per set of inputs in a process, never mixed across inputs."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from types import SimpleNamespace

import pytest

from interlude_dev import wiring as dev
from interlude_workload.testing import GcsEmulator

TINY = {"train_steps": 2, "finetune_steps": 1, "checkpoint_every": 1, "seed": 11, "data_date": "2024-01-15"}


def _objects(cloud: SimpleNamespace, bucket: str) -> dict[str, str]:
    """Every object in the bucket with its generation: a re-training would rewrite some."""
    return {blob.name: str(blob.generation) for blob in dev.gcs_client(cloud).list_blobs(bucket)}  # type: ignore[arg-type]


def test_reference_is_trained_once_per_inputs_and_apart_from_other_inputs(
    gcs_emulator: GcsEmulator, bucket: str
) -> None:
    cloud = SimpleNamespace(gcs_endpoint=gcs_emulator.endpoint, project="interlude-local")
    first = dev.reference_digest(cloud, bucket, TINY)  # type: ignore[arg-type]
    trained = _objects(cloud, bucket)
    assert trained, "the reference run wrote no checkpoint"

    # Pacing and bucket do not change the weights: the same digest, and nothing trained again.
    assert dev.reference_digest(cloud, bucket, {**TINY, "step_seconds": 0.5}) == first  # type: ignore[arg-type]
    assert _objects(cloud, bucket) == trained

    # Another seed is another reference, trained under a run key of its own: the first one's objects stay as
    # they were, and the weights differ.
    other = dev.reference_digest(cloud, bucket, {**TINY, "seed": 12})  # type: ignore[arg-type]
    assert other != first
    after = _objects(cloud, bucket)
    assert {name: after[name] for name in trained} == trained
    assert set(after) > set(trained)


def test_processes_it_starts_may_cache_bytecode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shell that sets PYTHONDONTWRITEBYTECODE=1 does not reach the local cloud (nor the agents its machines
    start) or Airflow: the running local cloud's own environment, read from /proc, has no such variable."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    cloud = dev.start_localcloud("default", tmp_path / "cloud")
    try:
        environ = Path(f"/proc/{cloud.process.pid}/environ").read_bytes().split(b"\0")
        assert not [e for e in environ if e.startswith(b"PYTHONDONTWRITEBYTECODE=")]
        assert b"PATH=" + os.environ["PATH"].encode() in environ  # the rest is passed on
        assert "PYTHONDONTWRITEBYTECODE" not in dev.airflow_env(tmp_path / "home", cloud)
    finally:
        cloud.stop()


def test_a_new_home_copies_the_named_template_and_a_home_with_a_db_keeps_it(tmp_path: Path) -> None:
    """The template's bytes, not a migration (which would write a real SQLite DB), end up in the new home."""
    template = tmp_path / "template.db"
    template.write_bytes(b"not a database: a copy, not a migration")
    home = tmp_path / "home"
    dev.ensure_airflow_db({"AIRFLOW_HOME": str(home), dev.DB_TEMPLATE_ENV: str(template)})
    assert (home / "airflow.db").read_bytes() == template.read_bytes()

    (home / "airflow.db").write_bytes(b"the home's own")
    dev.ensure_airflow_db({"AIRFLOW_HOME": str(home), dev.DB_TEMPLATE_ENV: str(template)})
    assert (home / "airflow.db").read_bytes() == b"the home's own"


def test_a_named_template_that_is_missing_means_a_real_migration(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "AIRFLOW_HOME": str(home), dev.DB_TEMPLATE_ENV: str(tmp_path / "gone.db")}
    dev.ensure_airflow_db(env, log=tmp_path / "migrate.log")
    with sqlite3.connect(home / "airflow.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchone()  # Airflow's schema, migrated
