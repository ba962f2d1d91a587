"""The GKE runtime check: the cluster's GKE version against the accelerator's minimum, before any node pool.

On GKE the workload's container image is the framework runtime (its shape is checked with the params); what the
platform adds is the cluster's version. A node pool of an accelerator the version predates fails at creation, so
it is refused first, naming ``gke_cluster``. Only minimums Google publishes are listed; an accelerator not listed
passes (its pool creation is the judge).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GkeMinimum:
    """The first GKE versions that run an accelerator's nodes, with the page that says so."""

    standard: str
    autopilot: str
    source: str


# The node label value (cloud.google.com/gke-tpu-accelerator) -> the minimum versions.
MINIMUMS: dict[str, GkeMinimum] = {
    # "Ironwood (TPU7x) is available in GKE Standard clusters that run version 1.34.0-gke.2201000 and later, and in
    # Autopilot clusters that run version 1.34.1-gke.3084001 and later."
    "tpu7x": GkeMinimum(
        "1.34.0-gke.2201000",
        "1.34.1-gke.3084001",
        "https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood",
    ),
}

_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)-gke\.(\d+)$")


def parse(version: str) -> tuple[int, int, int, int] | None:
    """``1.34.0-gke.2201000`` -> (1, 34, 0, 2201000); None for anything else."""
    m = _VERSION.match(version.strip())
    if m is None:
        return None
    major, minor, patch, build = (int(g) for g in m.groups())
    return major, minor, patch, build


def version_problem(accelerator: str, cluster_version: str, autopilot: bool = False) -> str | None:
    """None when a cluster at ``cluster_version`` runs ``accelerator`` nodes (or no minimum is published), else why."""
    minimum = MINIMUMS.get(accelerator)
    if minimum is None:
        return None
    needed = minimum.autopilot if autopilot else minimum.standard
    have, need = parse(cluster_version), parse(needed)
    assert need is not None, needed
    if have is None:
        return f"GKE version {cluster_version!r} is not a GKE version (MAJOR.MINOR.PATCH-gke.N)"
    if have < need:
        kind = "Autopilot" if autopilot else "Standard"
        return (
            f"{accelerator} needs GKE {needed} or later on {kind} clusters; "
            f"the cluster runs {cluster_version} ({minimum.source})"
        )
    return None
