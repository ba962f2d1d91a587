"""Held maintenance windows: the test owns the moment a window opens, the control plane sees Google's notice.

A held notice reads as any other over the Compute and TPU APIs and the metadata server (PENDING, windowStartTime,
latestWindowStartTime, windowEndTime in Google's order), and its window opens inside what they say: when the test
calls ``open_window`` (never before windowStartTime), on ``performMaintenance``, or at latestWindowStartTime at
the latest. Every check here is an order of events (the cloud's own log against the times the API printed), not a
duration, so a loaded machine does not change a verdict.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.error import HTTPError

import pytest
from google.cloud import tpu_v2

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import ZONE, Compute, fast_scenario, gpu_instance
from tests.include.interlude_localcloud.test_maintenance import (
    SCRIPT,
    boots_file,
    lines,
    make_node,
    metadata,
    raw_node,
    until,
)

HOUR = 3600.0  # one real second at the scenario's 3600x


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def events(lc: RunningLocalCloud, machine: str) -> list[dict[str, Any]]:
    return [e for e in lc.admin.events() if e.get("machine") == machine]


def started(lc: RunningLocalCloud, machine: str) -> dict[str, Any] | None:
    return next((e for e in events(lc, machine) if e["event"] == "maintenance_start"), None)


def instance_upcoming(compute: Compute, name: str) -> dict[str, Any]:
    """upcomingMaintenance as the Compute client returns it (the control plane's hook reads the same field)."""
    up = compute.get(name).resource_status.upcoming_maintenance
    return {
        "status": up.maintenance_status,
        "start": epoch(up.window_start_time),
        "latest": epoch(up.latest_window_start_time),
        "end": epoch(up.window_end_time),
        "can_reschedule": up.can_reschedule,
    }


@pytest.fixture
def gce(lc: RunningLocalCloud, compute: Compute) -> Iterator[str]:
    compute.wait(
        compute.instances.insert(project=lc.project, zone=ZONE, instance_resource=gpu_instance("h1", script=SCRIPT))
    )
    until(lambda: lines(boots_file(lc, "gce", "h1")) == ["boot"], what="first boot")
    yield f"gce-{ZONE}-h1"


def test_a_held_window_stays_closed_past_its_start_until_the_test_opens_it(
    lc: RunningLocalCloud, compute: Compute, gce: str
) -> None:
    lc.admin.maintenance(
        "gce", ZONE, "h1", "SCHEDULED", notice_seconds=HOUR / 4, held=True, latest_start_after=HOUR * 50
    )
    up = instance_upcoming(compute, "h1")
    # Google's notice, Google's order: the window may start from windowStartTime to latestWindowStartTime, and the
    # disruption is over by windowEndTime
    assert up["status"] == "PENDING" and up["can_reschedule"] is True
    assert up["start"] < up["latest"] < up["end"], up
    guest = metadata(lc, "gce", "h1", "instance/upcoming-maintenance").json()
    assert epoch(guest["window_start_time"]) == up["start"] and guest["maintenance_status"] == "PENDING"
    assert metadata(lc, "gce", "h1", "instance/maintenance-event").text == "TERMINATE_ON_HOST_MAINTENANCE"
    # windowStartTime passes on the wall clock: the window waits for the test
    until(lambda: time.time() > up["start"] + 0.5, what="past windowStartTime")
    assert compute.get("h1").status == "RUNNING" and instance_upcoming(compute, "h1")["status"] == "PENDING"
    assert started(lc, gce) is None and lines(boots_file(lc, "gce", "h1")) == ["boot"]
    opened = lc.admin.open_window("gce", ZONE, "h1")
    # the admin answers epoch seconds; the API prints milliseconds
    assert opened["window_start"] == pytest.approx(up["start"], abs=1e-3)
    assert opened["latest_start"] == pytest.approx(up["latest"], abs=1e-3)
    until(lambda: compute.get("h1").status == "TERMINATED", what="down")
    start = started(lc, gce)
    assert start is not None and start["cause"] == "released", start
    released = next(e for e in events(lc, gce) if e["event"] == "maintenance_window_released")
    assert up["start"] < released["t"] <= start["t"] < up["latest"], (up, released, start)
    until(lambda: lines(boots_file(lc, "gce", "h1")) == ["boot", "term", "boot"], what="back after the duration")


def test_opened_before_its_start_a_held_window_opens_at_its_start(
    lc: RunningLocalCloud, compute: Compute, gce: str
) -> None:
    """The test may say "go" early; the window still does not open before what the control plane was told."""
    lc.admin.maintenance("gce", ZONE, "h1", "SCHEDULED", notice_seconds=HOUR, held=True, latest_start_after=HOUR * 50)
    up = instance_upcoming(compute, "h1")
    opened = lc.admin.open_window("gce", ZONE, "h1")
    assert opened["opens_at"] == pytest.approx(up["start"], abs=1e-3)
    start = until(lambda: started(lc, gce), timeout=30, what="the window opened")
    assert start["cause"] == "released" and start["t"] >= up["start"], (start, up)


def test_perform_maintenance_opens_a_held_window_at_once(lc: RunningLocalCloud, compute: Compute, gce: str) -> None:
    lc.admin.maintenance(
        "gce", ZONE, "h1", "SCHEDULED", notice_seconds=HOUR * 50, held=True, latest_start_after=HOUR * 50
    )
    up = instance_upcoming(compute, "h1")
    compute.wait(compute.instances.perform_maintenance(project=lc.project, zone=ZONE, instance="h1"))
    start = until(lambda: started(lc, gce), what="the window opened")
    assert start["cause"] == "performMaintenance" and start["t"] < up["start"], (start, up)


def test_a_held_window_opens_at_its_latest_start_at_the_latest(
    lc: RunningLocalCloud, compute: Compute, gce: str
) -> None:
    lc.admin.maintenance("gce", ZONE, "h1", "SCHEDULED", notice_seconds=HOUR / 4, held=True, latest_start_after=HOUR)
    up = instance_upcoming(compute, "h1")
    start = until(lambda: started(lc, gce), timeout=60, what="the window opened by itself")
    assert start["cause"] == "latest_start" and start["t"] >= up["latest"], (start, up)
    assert not any(e["event"] == "maintenance_window_released" for e in events(lc, gce))


def test_a_held_tpu_window_and_a_held_drill(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    """TPU nodes too, and simulateMaintenanceEvent's notice when admin next-maintenance holds it."""
    make_node(lc, tpu, "h2")
    machine = f"tpu-{ZONE}-h2"
    lc.admin.next_maintenance("SCHEDULED", notice_seconds=HOUR / 4, kind="tpu", held=True, latest_start_after=HOUR * 50)
    from tests.include.interlude_localcloud.test_maintenance import v2alpha1

    name = f"projects/{lc.project}/locations/{ZONE}/nodes/h2"
    v2alpha1(lc).projects().locations().nodes().simulateMaintenanceEvent(name=name, body={}).execute()
    up = raw_node(lc, "h2")["upcomingMaintenance"]
    assert up["maintenanceStatus"] == "PENDING"
    assert up["windowStartTime"] < up["latestWindowStartTime"] < up["windowEndTime"], up
    until(lambda: time.time() > epoch(up["windowStartTime"]) + 0.5, what="past windowStartTime")
    assert raw_node(lc, "h2")["state"] == "READY" and started(lc, machine) is None
    lc.admin.open_window("tpu", ZONE, "h2")
    until(lambda: raw_node(lc, "h2").get("health") == "UNHEALTHY_MAINTENANCE", what="down")
    start = started(lc, machine)
    assert start is not None and start["cause"] == "released", start


def test_what_is_not_held_keeps_its_clock(lc: RunningLocalCloud, compute: Compute, gce: str) -> None:
    """A held window needs a latest start to open by; a window not held cannot be opened by the test."""
    with pytest.raises(HTTPError) as no_latest:
        lc.admin.maintenance("gce", ZONE, "h1", "SCHEDULED", held=True)
    assert no_latest.value.code == 400
    assert lc.admin.machine("gce", ZONE, "h1")["maintenance"] is None
    lc.admin.maintenance("gce", ZONE, "h1", "SCHEDULED", notice_seconds=HOUR * 50)
    with pytest.raises(HTTPError) as not_held:
        lc.admin.open_window("gce", ZONE, "h1")
    assert not_held.value.code == 400
    up = instance_upcoming(compute, "h1")
    assert up["latest"] == up["start"]  # not held, no spread asked: it opens at its start, as before


def test_the_scenario_gives_every_window_a_latest_start(tmp_path: Any) -> None:
    """`maintenance.<kind>.latest_start_after` spreads the latest start (and the end after it) for every notice."""
    from interlude_localcloud.cloud import Cloud, Machine

    sc = fast_scenario(maintenance={"gce": {"scheduled_notice": 3600, "duration": 600, "latest_start_after": 7200}})
    cloud = Cloud(sc, tmp_path)
    m = Machine("gce", ZONE, "x", {"status": "RUNNING"}, False, "", 0, proc=None)  # type: ignore[arg-type]
    with cloud.lock:
        cloud.schedule_maintenance(m, "SCHEDULED", 3600.0)
    up = cloud.upcoming(m)
    assert up is not None
    start, latest, end = (epoch(up[k]) for k in ("windowStartTime", "latestWindowStartTime", "windowEndTime"))
    assert latest - start == pytest.approx(2.0, abs=0.01) and end - latest == pytest.approx(600 / 3600, abs=0.01)
