"""A spot preemption that really loses steps, and the run's timeline in the Interlude view showing them recomputed
(issue 36's must-show).

The local cloud preempts the spot TPU with no grace (SIGKILL right after SIGTERM: no time to save), between two
periodic checkpoints, so the steps trained since the last commit are lost. What was lost is read from the workload's
own log: the new boot says how far the previous boot had reported ("previous boot ... last reported at T, step S")
and where it resumed ("resume point: step R"). That S is the progress file the preemption was timed by, so it is
held to the preempted boot's own console as the machine's serial log kept it (the cloud's copy of the process's
stdout, complete up to the SIGKILL): the steps that boot printed computing and committing, with its own clock. It
computed past PREEMPT_AT, last committed R, and its console agrees with "at T, step S" (every step it printed before
T is at most S, every one after is at least S). The run report's count must be that S - R, and the run's timeline,
built and drawn by interlude.ui from the report and the bucket's committed checkpoints (what the Timeline page
serves), must draw those steps as recomputed on train's lane. The page is opened in headless chromium (screenshot
in var/artefacts/browser/interlude-preemption/); the final weights equal an uninterrupted run's.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from interlude_dev import scenario
from interlude_dev import wiring as dev

from .stage_fixtures import BUCKET, final_digest, reference, run_dag, when_training, workload_log

pytestmark = pytest.mark.e2e
TRAIN_STEPS, EVERY = 120, 30
PREEMPT_AT = 40  # 10 steps past the commit at 30, 20 before the next


@pytest.fixture
def stage_scenario(tmp_path: Path) -> Path:
    """stage_fixtures' fast scenario, with no grace between SIGTERM and SIGKILL when a machine goes down."""
    return scenario.build(tmp_path / "no-grace.yaml", "default", scenario.FAST, {"stop_grace_seconds": 0.0})


def lost_in_the_workloads_words(log: str) -> tuple[int, int, str]:
    """(the step the previous boot last reported, the step the new boot resumed from, when the previous boot last
    reported it), from the new boot's lines."""
    reported = re.search(r"new boot \S+ \(previous boot \S+ last reported at (\S+), step (\d+),", log)
    resumed = re.findall(r"resume point: step (\d+)", log)
    assert reported and len(resumed) == 1, log[-3000:]  # the first boot started fresh: only the new boot resumed
    return int(reported[2]), int(resumed[0]), reported[1]


def keep_console(disk_dir: str, kept: dict[str, str]) -> threading.Thread:
    """Copy the machine's serial log (the cloud's file of its processes' stdout) until it shows the preempted boot's
    end and the next boot, or the machine's disk is gone (deleted): the last copy holds the preempted boot whole."""
    path = Path(disk_dir) / "serial.log"

    def loop() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                kept["console"] = path.read_text(errors="replace")
            except OSError:
                return
            if re.search(r"shutdown \(preempted\)[\s\S]*\[localcloud [^]]+\] boot #2", kept["console"]):
                return
            time.sleep(0.2)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def preempted_boot(console: str, stage: str, steps: int) -> tuple[list[tuple[int, str]], list[int]]:
    """From the serial log: the first boot's "step N/steps" lines (step, its own time stamp) and its committed steps,
    everything that boot printed up to the cloud's next boot line."""
    boots = re.split(r"^\[localcloud [^]]+\] boot #\d+$", console, flags=re.M)
    assert len(boots) >= 2 and "shutdown (preempted)" in boots[1], console[-3000:]
    first = boots[1]
    computed = [(int(n), t) for t, n in re.findall(rf"^(\S+) \[[^]]*/{stage}\] step (\d+)/{steps} loss", first, re.M)]
    committed = [int(n) for n in re.findall(rf"^\S+ \[[^]]*/{stage}\] checkpoint step (\d+) ", first, re.M)]
    return computed, committed


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
    stage_stack: Any,
    tmp_path: Path,
) -> None:
    cloud, _ = stage_stack
    preempted: list[str] = []
    kept: dict[str, str] = {}
    keepers: list[threading.Thread] = []

    def preempt(m: dict[str, Any]) -> None:
        cloud.admin.preempt("tpu", m["zone"], m["name"])
        preempted.append(m["name"])
        keepers.append(keep_console(m["disk_dir"], kept))

    due = lambda m, p: m["kind"] == "tpu" and m["state"] == "READY" and int(p.get("step") or 0) >= PREEMPT_AT  # noqa: E731
    watcher = when_training(cloud, due, preempt)
    result, run_key = run_dag(stage_stack, tmp_path, spot=True, train_steps=TRAIN_STEPS, checkpoint_every=EVERY)
    watcher.join(timeout=5)
    for keeper in keepers:
        keeper.join(timeout=5)
    assert preempted, "the machine was never preempted"
    assert result.succeeded, result.log[-4000:]

    reported, resumed, reported_at = lost_in_the_workloads_words(workload_log(cloud, run_key, "train"))
    # the preempted boot's own console: it computed past PREEMPT_AT, last committed the step the new boot resumed
    # from (steps past that commit were lost), and its stamps agree with the report's "at T, step S"
    computed, committed = preempted_boot(kept.get("console", ""), "train", TRAIN_STEPS)
    assert computed and committed, kept.get("console", "")[-3000:]
    assert max(n for n, _ in computed) >= PREEMPT_AT, computed
    assert resumed == EVERY == max(committed), (resumed, committed)
    # (a step's line is printed just after its progress is recorded: the reported step's own line may come later)
    said_before = [n for n, t in computed if t < reported_at]
    said_after = [n for n, t in computed if t > reported_at]
    assert all(n <= reported for n in said_before) and all(n >= reported for n in said_after), (
        f"the console's steps disagree with the report's step {reported} at {reported_at}: {computed}"
    )
    assert reported <= max(n for n, _ in computed) + 10, (reported, computed)  # it prints every 10th step
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
