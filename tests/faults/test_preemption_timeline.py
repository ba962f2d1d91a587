"""A spot preemption that really loses steps, and the run's timeline in the Interlude view showing them recomputed
(issue 36's must-show).

The local cloud preempts the spot TPU with no grace (SIGKILL right after SIGTERM: no time to save), between two
periodic checkpoints, so the steps trained since the last commit are lost. What was lost is read from the workload's
own log: the new boot says how far the previous boot had reported ("previous boot ... step S") and where it resumed
("resume point: step R"). The run report's count must be that S - R, and the run's timeline, built and drawn by
interlude.ui from the report and the bucket's committed checkpoints (what the Timeline page serves), must draw those
steps as recomputed on train's lane. The page is opened in headless chromium (screenshot in
var/artefacts/browser/interlude-preemption/); the final weights equal an uninterrupted run's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from interlude_dev import wiring as dev

from .stage_fixtures import (  # noqa: F401 - fixtures
    BUCKET,
    final_digest,
    reference,
    run_dag,
    stage_airflow_db,
    stage_stack,
    when_training,
    workload_log,
)

pytestmark = pytest.mark.e2e
TRAIN_STEPS, EVERY = 120, 30
PREEMPT_AT = 40  # 10 steps past the commit at 30, 20 before the next


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    """stage_fixtures' fast scenario, with no grace between SIGTERM and SIGKILL when a machine goes down."""
    data = yaml.safe_load((dev.SCENARIOS / "default.yaml").read_text())
    data["time_scale"] = 1800
    data["maintenance"]["tpu"]["duration"] = 3600
    data["stop_grace_seconds"] = 0.0
    path = tmp_path / "no-grace.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def lost_in_the_workloads_words(log: str) -> tuple[int, int]:
    """(the step the previous boot last reported, the step the new boot resumed from), from the new boot's lines."""
    reported = re.search(r"new boot \S+ \(previous boot \S+ last reported at \S+, step (\d+),", log)
    resumed = re.findall(r"resume point: step (\d+)", log)
    assert reported and len(resumed) == 1, log[-3000:]  # the first boot started fresh: only the new boot resumed
    return int(reported[1]), int(resumed[0])


def timeline_html(cloud: dev.LocalCloud, report: dict[str, Any], run_key: str) -> str:
    """The Timeline page as interlude.ui builds it for this report (checkpoints listed by its own reader)."""
    from interlude.ui import pages, source, svg
    from interlude.ui.timeline import from_training_report

    with pytest.MonkeyPatch.context() as env:
        env.setenv("STORAGE_EMULATOR_HOST", cloud.gcs_endpoint)
        commits = {s["stage"]: source.committed_steps(BUCKET, run_key, s["stage"]) for s in report["stages"]}
    tl = from_training_report(report, commits)
    return pages.timeline_page("/interlude", "interlude_training", run_key, tl, svg.render(tl), [])


def test_a_preemption_without_time_to_save_shows_its_lost_steps_as_recomputed(
    stage_stack: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    cloud, _ = stage_stack
    preempted: list[str] = []

    def preempt(m: dict[str, Any]) -> None:
        cloud.admin.preempt("tpu", m["zone"], m["name"])
        preempted.append(m["name"])

    due = lambda m, p: m["kind"] == "tpu" and m["state"] == "READY" and int(p.get("step") or 0) >= PREEMPT_AT  # noqa: E731
    watcher = when_training(cloud, due, preempt)
    result, run_key = run_dag(stage_stack, tmp_path, spot=True, train_steps=TRAIN_STEPS, checkpoint_every=EVERY)
    watcher.join(timeout=5)
    assert preempted, "the machine was never preempted"
    assert result.succeeded, result.log[-4000:]

    reported, resumed = lost_in_the_workloads_words(workload_log(cloud, run_key, "train"))
    assert resumed == EVERY and reported >= PREEMPT_AT, (reported, resumed)  # steps past the commit were lost
    report = dev.read_report(cloud, BUCKET, run_key)
    assert report is not None
    (event,) = report["events"]
    assert event["kind"] == "preemption" and event["resumed_from_step"] == resumed, event
    assert event["steps_recomputed"] == reported - resumed == report["steps_recomputed"], (event, reported, resumed)
    assert final_digest(cloud, run_key) == reference(cloud, train_steps=TRAIN_STEPS, checkpoint_every=EVERY)

    from tests.e2e.browser import chromium

    with chromium(tmp_path / "screenshots", "interlude-preemption") as b:
        b.page.set_content(timeline_html(cloud, report, run_key))
        b.screenshot("timeline-preemption")
        lane = b.page.locator("g.lane.stage[data-stage='train']")
        assert lane.count() == 1
        recomputed = b.page.locator("g.event[data-kind='preemption'] rect.recompute")
        assert recomputed.count() == 1 and recomputed.get_attribute("data-steps") == str(reported - resumed)
        hover = str(recomputed.locator("title").text_content())
        assert f"{reported - resumed} step(s) recomputed after resuming from step {resumed}" in hover, hover
        assert b.page.locator("g.legend-item[data-key='recompute']").count() == 1
    assert b.saved and b.saved[0].stat().st_size > 0
