"""The local cloud's own record of machine lifetimes, which the cap test of the stack counts from (issue 32).

A machine is alive from its create request to its deletion. The record is checked against the API calls
that made and removed the machines (each lifetime inside the span of those calls), and the peak of machines
alive at once is counted from it with no sampling: two machines overlapping for a moment count as two.
"""

from __future__ import annotations

import time

from interlude_dev import wiring as dev
from interlude_localcloud.testing import most_alive_at_once
from tests.faults.support import ZONES, tpu_hook

NODE = {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e"}


def test_lifetimes_bracket_the_api_calls_and_a_short_overlap_counts(cloud: dev.LocalCloud) -> None:
    tpu = tpu_hook(cloud)
    name = f"life-{time.time_ns()}"
    t0 = time.time()
    tpu.create_node(ZONES[0], f"{name}-a", NODE)
    t1 = time.time()
    tpu.create_node(ZONES[0], f"{name}-b", NODE, wait=False)  # b's create request is in: a and b overlap ...
    tpu.delete_node(ZONES[0], f"{name}-a")  # ... until a is gone, a moment later
    t2 = time.time()
    tpu.delete_node(ZONES[0], f"{name}-b")
    t3 = time.time()
    lives = {e["name"]: e for e in cloud.admin.lifetimes(t0) if e["name"].startswith(name)}
    assert set(lives) == {f"{name}-a", f"{name}-b"}, lives
    a, b = lives[f"{name}-a"], lives[f"{name}-b"]
    assert t0 <= a["created"] <= t1 <= b["created"] < a["deleted"] <= t2 <= b["deleted"] <= t3, (t0, t1, t2, t3, lives)
    assert most_alive_at_once(list(lives.values())) == (2, sorted(f"{e['id']}@{e['created']}" for e in lives.values()))
    # Touching is not overlapping; a machine still alive lives on.
    one = {"id": "x", "created": 1.0, "deleted": 2.0}
    assert most_alive_at_once([one, {"id": "y", "created": 2.0, "deleted": 3.0}])[0] == 1
    assert most_alive_at_once([one, {"id": "y", "created": 1.5, "deleted": None}])[0] == 2
