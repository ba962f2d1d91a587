"""interlude_dev.scenario: a shipped scenario plus a test's changes, as the local cloud reads it."""

from __future__ import annotations

from pathlib import Path

import yaml

from interlude_dev import scenario
from interlude_dev.scenario import DELETE, FAST, build, load, merged


def test_changes_merge_mappings_key_by_key_replace_other_values_and_delete_on_request() -> None:
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 2, "e": {"f": 3}}
    out = merged(base, {"a": {"c": [3], "g": 4}, "d": DELETE, "e": 5, "h": {"i": 6}})
    assert out == {"a": {"b": 1, "c": [3], "g": 4}, "e": 5, "h": {"i": 6}}
    assert base == {"a": {"b": 1, "c": [1, 2]}, "d": 2, "e": {"f": 3}}  # the base is left as it was


def test_a_later_change_wins_and_the_edit_comes_last(tmp_path: Path) -> None:
    def edit(data: dict) -> None:
        data["zones"]["us-central1-a"]["tpu"]["accelerator_types"].append("v6e-16")

    path = build(tmp_path / "s.yaml", "default", FAST, {"time_scale": 600}, edit=edit)
    data = yaml.safe_load(path.read_text())
    shipped = load("default")
    assert data["time_scale"] == 600 and data["maintenance"]["tpu"]["duration"] == 3600
    assert data["maintenance"]["gce"] == shipped["maintenance"]["gce"]  # untouched keys kept
    types = shipped["zones"]["us-central1-a"]["tpu"]["accelerator_types"]
    assert data["zones"]["us-central1-a"]["tpu"]["accelerator_types"] == [*types, "v6e-16"]
    assert load("default") == shipped  # the shipped file is not written


def test_the_scenarios_are_the_local_clouds_shipped_ones() -> None:
    assert (scenario.SCENARIOS / "default.yaml").is_file()
    assert load("gke_serving_run")["gke"]
