"""The GKE version check: Ironwood's published minimums, Standard and Autopilot, and what it does not judge."""

from __future__ import annotations

import pytest

from interlude.runtimes.gke import MINIMUMS, parse, version_problem


@pytest.mark.parametrize(
    ("version", "autopilot", "ok"),
    [
        ("1.34.0-gke.2201000", False, True),
        ("1.34.0-gke.2200999", False, False),
        ("1.33.5-gke.1080000", False, False),
        ("1.35.0-gke.1000", False, True),
        ("1.34.0-gke.2201000", True, False),  # Autopilot needs 1.34.1-gke.3084001
        ("1.34.1-gke.3084001", True, True),
        ("2.0.0-gke.1", True, True),
    ],
)
def test_tpu7x_needs_the_versions_googles_page_names(version: str, autopilot: bool, ok: bool) -> None:
    problem = version_problem("tpu7x", version, autopilot)
    assert (problem is None) == ok, problem
    if problem:
        assert "tpu7x needs GKE 1.34" in problem and version in problem and MINIMUMS["tpu7x"].source in problem


def test_accelerators_without_a_published_minimum_pass_and_bad_versions_are_named() -> None:
    assert version_problem("tpu-v6e-slice", "1.20.0-gke.1") is None
    assert "is not a GKE version" in str(version_problem("tpu7x", "latest"))
    assert parse("1.34.0-gke.2201000") == (1, 34, 0, 2201000)
    assert parse("1.34") is None
