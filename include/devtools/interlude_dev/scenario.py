"""Scenarios for tests and tools: a shipped scenario plus the changes one test needs (issue 44: one builder, not a
scenario dictionary pasted into each fault test).

A test says what differs from a shipped scenario (``changes``, merged key by key into it; ``edit`` for what a
mapping cannot say, such as appending to a list) and gets a file the local cloud reads; the shipped files stay as
they are. What most fault tests share is a name here (:data:`FAST`), so a change to it is made once.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from interlude_dev.wiring import SCENARIOS

# The shipped scenarios' clock 1800 times faster (an hour is 2 s), and a TPU's host maintenance an hour long:
# 2 s here, long enough for a stage's poll to see the machine down.
FAST: Mapping[str, Any] = {"time_scale": 1800, "maintenance": {"tpu": {"duration": 3600}}}

DELETE = object()  # as a value in ``changes``: remove that key from the base


def merged(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in: a mapping merges into a mapping key by key; any other value (lists
    included) replaces; :data:`DELETE` removes the key. Neither argument is changed."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load(base: str = "default") -> dict[str, Any]:
    """A shipped scenario (``include/interlude_localcloud/scenarios/<base>.yaml``) as data."""
    data = yaml.safe_load((SCENARIOS / f"{base}.yaml").read_text())
    assert isinstance(data, dict), f"scenario {base} is not a mapping"
    return data


def build(
    path: Path,
    base: str = "default",
    *changes: Mapping[str, Any],
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """Write the shipped scenario ``base`` with each of ``changes`` merged in (in order, see :func:`merged`), then
    ``edit`` applied to the result, to ``path``; returns ``path``."""
    data = load(base)
    for change in changes:
        data = merged(data, change)
    if edit is not None:
        edit(data)
    path.write_text(yaml.safe_dump(data))
    return path


GKE_VERSION = "1.33.5-gke.1080000"
# The workload image's interpreter in the local GKE's pods: this project's python (the image is not pulled here).
WORKLOAD_IMAGE = {"*/workload:*": {"python": ["{python}"], "python3": ["{python}"]}}


def gke_cluster(name: str, location: str, version: str = GKE_VERSION) -> dict[str, Any]:
    """A GKE cluster as a scenario holds it: one CPU node pool (``default-pool``); a run creates its own pools."""
    pool = {"name": "default-pool", "machine_type": "e2-standard-4", "initial_nodes": 1, "max_nodes": 1}
    return {"name": name, "location": location, "kubernetes_version": version, "node_pools": [pool]}


def gke(*clusters: Mapping[str, Any], run: bool = True) -> dict[str, Any]:
    """A scenario's ``gke`` section: these clusters; with ``run``, their pods really run (the workload's image as
    this project's python), else GKE only answers the API."""
    section: dict[str, Any] = {"clusters": [dict(c) for c in clusters]}
    if run:
        section.update(run=True, images=WORKLOAD_IMAGE)
    return section
