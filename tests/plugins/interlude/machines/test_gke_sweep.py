"""The sweeper's inputs are refused before any cloud call: zones and ``gke_clusters`` (LOCATION/CLUSTER) whose
shape Google would not accept, each named (the end-to-end sweep: tests/faults/test_gke_sweeper.py)."""

from __future__ import annotations

import pytest

from interlude.machines.gke_sweep import CLUSTER_RE
from interlude.training import tasks


def _unused_state(run: tuple[str, str]) -> str | None:
    raise AssertionError("no run's state is asked for before the inputs are checked")


@pytest.mark.parametrize("value", ["us-central1/train", "us-central1-a/interlude-train", "europe-west4/c1"])
def test_cluster_shapes_google_accepts(value: str) -> None:
    assert CLUSTER_RE.match(value)


@pytest.mark.parametrize(
    "value", ["train", "us-central1/", "/train", "us-central1/Train", "us-central1/t; rm -rf /", "../x/train", "a/b/c"]
)
def test_a_bad_cluster_is_refused_naming_the_param_before_any_call(value: str) -> None:
    with pytest.raises(ValueError, match="gke_clusters"):
        tasks.sweep(["us-central1-a"], _unused_state, [value])


def test_a_bad_zone_is_refused_naming_the_param() -> None:
    with pytest.raises(ValueError, match="zones"):
        tasks.sweep(["mars"], _unused_state, [])
