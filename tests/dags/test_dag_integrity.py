"""Every DAG imports cleanly, explains itself, and parses without touching cloud clients or heavy modules. What a
parse costs is benchmarks/dag_parse.py's figure (its smoke test: tests/benchmarks/test_dag_parse_smoke.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DAG_FILES = sorted((ROOT / "dags").glob("*.py"))
HEAVY = [
    "google.cloud.tpu_v2",
    "google.cloud.compute_v1",
    "google.cloud.storage",
    "googleapiclient.discovery",
    "numpy",
    "interlude.hooks.tpu",
    "interlude.hooks.compute",
]

# Every DAG file in one interpreter (one Airflow import, not one per file), each parsed by a DagBag of its own;
# a heavy module counts against the file whose parse first imported it.
PROBE = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
heavy = json.loads(sys.argv[1])
results = {}
for path in sys.argv[2:]:
    before = set(sys.modules)
    bag = DagBag(path)
    results[path] = {
        "errors": {k: str(v) for k, v in bag.import_errors.items()},
        "dags": {d.dag_id: {"doc_md": bool(d.doc_md and len(d.doc_md) > 200), "tags": sorted(d.tags or []),
                            "tasks": len(d.tasks)} for d in bag.dags.values()},
        "heavy": [m for m in heavy if m in sys.modules and m not in before],
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """What parsing each DAG file gave, in a new interpreter that never imported a heavy module before."""
    env = {
        "AIRFLOW_HOME": str(tmp_path_factory.mktemp("dag-integrity-home")),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "PATH": "/usr/bin:/bin",
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(HEAVY), *map(str, DAG_FILES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_there_are_dags() -> None:
    assert DAG_FILES, "no DAG files in dags/"


@pytest.mark.parametrize("path", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_imports_cleanly_and_light(parsed: dict[str, dict], path: Path) -> None:
    result = parsed[str(path)]
    assert result["errors"] == {}
    assert result["dags"], f"{path.name} defines no DAG"
    for dag_id, info in result["dags"].items():
        assert info["doc_md"], f"{dag_id} needs a doc_md that explains it"
        assert info["tags"], f"{dag_id} needs tags"
    assert result["heavy"] == [], f"parsing imported cloud clients or heavy modules: {result['heavy']}"
