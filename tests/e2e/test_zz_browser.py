"""The Airflow UI on the production-shaped stack, used as a person would: headless chromium, loopback only.

Log in with the SimpleAuthManager admin, open the Trigger form of the lifecycle DAG, switch on
`drill_maintenance` (every other param at its default), submit it, and watch the run page (grid + run
header) until the run is successful. The drill is then judged from facts that do not come from the code
that recorded it: in each stage (train and finetune) the workload's own log in GCS says which committed
step it held at and resumed from, and the recorded event (events/ and report.json) must carry that step
and a non-zero downtime; the `run_report` task's log, read in the browser, shows the same; the local
cloud's page of the machine shows one boot plus one per drill. Then open the `train` task's Details,
follow its extra links (the machine, the checkpoint folder) and check they resolve to the local cloud's
pages for *this* run: the machine's history ends in its deletion (teardown), the checkpoint folder lists
COMMITTED steps. Screenshots of every step land in the test's tmp dir and in var/artefacts/browser/.

The same run, in the Interlude view (interlude.ui): while it trains, the Fleet page lists its machine; once it is
over, the `train` task's Timeline extra link opens its timeline (a lane per stage, a band group per drill, a tick
per committed checkpoint counted in the bucket, the report's goodput), and the Runs page (opened from the UI's
navigation, inside its iframe) shows its row. Without a session the view answers 401, with a bad token 403.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any
from urllib.parse import quote

import pytest
import requests

from interlude import naming
from interlude.training.spec import RunSpec
from tests.e2e.browser import Browser, chromium, is_loopback
from tests.e2e.stack_fixtures import DAG_ID, DEFAULT_BUCKET, TERMINAL, Stack

pytestmark = pytest.mark.e2e

RUN_TIMEOUT = 900.0  # defaults + a drill per stage (60 train + 30 finetune steps): ~2 min idle, 5+ min loaded
STAGES = ("train", "finetune")


def log_in(b: Browser, state: dict[str, Any]) -> None:
    page = b.page
    page.goto(state["base_url"] + "/")
    page.wait_for_url("**/auth/login**")
    page.locator("input[name=username]").fill(state["auth"]["username"])
    page.locator("input[name=password]").fill(state["auth"]["password"])
    b.screenshot("login")
    page.locator("button[type=submit]").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)


def manual_runs(stack: Stack) -> set[str]:
    runs = stack.api.call("GET", f"dags/{DAG_ID}/dagRuns", params={"limit": 100, "run_type": "manual"})
    return {r["dag_run_id"] for r in runs["dag_runs"]}


def switch_on(b: Browser, dialog: Any, param: str) -> None:
    """Flip a boolean param's switch in the Trigger form, as a person clicks it (the input itself is hidden)."""
    box = dialog.get_by_role("checkbox", name=param, exact=True)
    assert not box.is_checked(), f"{param} is already on in the form as it comes"
    dialog.locator(f"[id='switch:element_{param}:control']").click()
    assert box.is_checked(), f"clicking the {param} switch did not turn it on"
    b.screenshot(f"trigger-form-{param}")


def submit_trigger_form(
    b: Browser, stack: Stack, switches: tuple[str, ...] = (), typed: dict[str, str] | None = None
) -> str:
    """Trigger -> the form as it comes, `switches` turned on, `typed` values typed over the defaults -> Trigger.

    Returns the id of the run it created."""
    page = b.page
    before = manual_runs(stack)
    page.goto(f"{stack.state['base_url']}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for()
    b.screenshot("trigger-form")
    for param in switches:
        switch_on(b, dialog, param)
    for param, text in (typed or {}).items():
        dialog.locator(f"#element_{param}").fill(text)
    if typed:
        b.screenshot("trigger-form-typed")
    submit = dialog.get_by_role("button", name="Trigger", exact=True)
    assert submit.is_enabled(), "the Trigger form refuses its own defaults (see the screenshot)"
    submit.click()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = manual_runs(stack) - before
        if new:
            assert len(new) == 1, new
            return new.pop()
        time.sleep(1)
    b.screenshot("trigger-submitted")
    raise AssertionError("submitting the Trigger form created no run")


def params_changed_from_defaults(conf: dict[str, Any]) -> dict[str, Any]:
    """The run's conf (what the form sent) against the defaults the form was generated from."""
    defaults = {name: default for name, (default, _) in RunSpec.form_schema().items()}
    assert set(conf) <= set(defaults), set(conf) - set(defaults)
    return {name: value for name, value in conf.items() if value != defaults[name]}


def watch_run_in_grid(b: Browser, stack: Stack, run_id: str) -> str:
    """Once the REST API says the run is over, open its page (reloading until its header shows a final state);
    returns that state as the UI shows it.

    The page is opened when there is an end to show, not kept open and reloaded through the run: a reload of
    the UI every few seconds cost chromium and the api-server more CPU than the run itself, and nothing was
    asserted on the pages in between. For the same reason the page the Trigger button left open (the DAG's,
    which the UI refreshes itself while a run is active) is left for a blank one while the run goes.
    """
    page = b.page
    page.goto("about:blank")
    stack.api.wait_run(run_id, RUN_TIMEOUT)
    url = f"{stack.state['base_url']}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"
    page.goto(url)
    badge = page.get_by_test_id("header-card").get_by_test_id("state-badge")
    deadline = time.monotonic() + 60
    shown = ""
    while time.monotonic() < deadline:
        badge.wait_for()
        shown = badge.inner_text().strip().lower()
        if shown in ("success", "failed"):
            break
        time.sleep(5)
        page.reload()
    # The grid has this run's column with every task (teardown last), not only the header.
    page.get_by_test_id(f"grid-{run_id}-teardown").wait_for()
    b.screenshot(f"run-{shown or 'timeout'}")
    return shown


def extra_links(b: Browser, stack: Stack, run_id: str, task_id: str) -> dict[str, str]:
    """The task's Details tab, as the UI renders it: Extra Links buttons -> {name: href}."""
    page = b.page
    page.goto(f"{stack.state['base_url']}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/{task_id}/details")
    page.get_by_text("Extra Links").wait_for()
    b.screenshot(f"{task_id}-details")
    links = {}
    for name in ("Machine", "Checkpoints"):
        anchor = page.get_by_role("link", name=name, exact=True)
        links[name] = str(anchor.get_attribute("href"))
    return links


def open_link(b: Browser, url: str, name: str) -> str:
    """Follow a link in the browser (the local cloud's page); return the page's text."""
    assert is_loopback(url), f"{name} link leaves this machine: {url}"
    response = b.page.goto(url)
    assert response is not None and response.status == 200, (url, response and response.status)
    b.screenshot(name.lower())
    return str(b.page.inner_text("body"))


def workload_held_and_resumed(run_key: str, stage: str) -> tuple[list[int], list[int]]:
    """The steps the workload says, in its own log in GCS, it held at and resumed from (every boot)."""
    from interlude_workload.checkpoints import CheckpointStore

    log = CheckpointStore(DEFAULT_BUCKET, run_key, stage).read_log()
    held = [int(s) for s in re.findall(r"holding at committed step (\d+)", log)]
    resumed = [int(s) for s in re.findall(r"resume point: step (\d+)", log)]
    return held, resumed


def recorded_drills(run_key: str) -> dict[str, dict[str, Any]]:
    """Each stage's one maintenance event, as recorded (events/) and as the report (report.json) holds it."""
    from interlude.training import events
    from interlude_workload import layout

    recorded = events.load_events(DEFAULT_BUCKET, run_key)
    blob = events.storage_client().bucket(DEFAULT_BUCKET).blob(layout.report_object(run_key))
    reported = json.loads(blob.download_as_bytes())["events"]
    # The report holds the recorded events unchanged, each with its derived cost beside it (interlude.training.badput).
    assert all(float(e["beyond_downtime_s"]) >= 0 for e in reported), reported
    as_recorded = [{k: v for k, v in e.items() if k != "beyond_downtime_s"} for e in reported]
    assert as_recorded == recorded, "the report does not hold the recorded events"
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for event in recorded:
        by_stage.setdefault(event["stage"], []).append(event)
    assert set(by_stage) == set(STAGES), f"a drill per stage was asked for; recorded: {recorded}"
    assert all(len(found) == 1 for found in by_stage.values()), by_stage
    return {stage: found[0] for stage, found in by_stage.items()}


def check_drill(run_key: str, stage: str, event: dict[str, Any]) -> int:
    """The event says what the workload's own log says: held at step N, resumed from N; downtime > 0."""
    held, resumed = workload_held_and_resumed(run_key, stage)
    assert held, f"{stage}: the workload never held (its log says no 'holding at committed step')"
    assert event["drill"] is True and event["kind"] == "maintenance", event
    assert event["checkpoint_step"] == held[0] > 0, (stage, held, event)
    assert event["resumed_from_step"] == held[0] and held[0] in resumed, (stage, held, resumed, event)
    assert event["downtime_s"] > 0, event
    return int(held[0])


def task_log_text(b: Browser, stack: Stack, run_id: str, task_id: str, wait_for: str, expand: str = "") -> str:
    """The task's log as the UI shows it (the task instance page opens on its Logs tab).

    `expand`: a collapsed group of log lines to open first, as a person clicks it (the failure callback
    writes into "Post Execute")."""
    page = b.page
    page.goto(f"{stack.state['base_url']}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/{task_id}")
    if expand:
        page.get_by_text(expand).first.click()
    page.get_by_text(wait_for).first.wait_for()
    b.screenshot(f"{task_id}-log")
    return str(page.inner_text("body"))


def test_trigger_form_with_a_drill_runs_to_success_and_the_ui_tells_the_truth(stack: Stack, tmp_path: Any) -> None:
    with chromium(tmp_path / "screenshots") as b:
        log_in(b, stack.state)
        run_id = submit_trigger_form(b, stack, switches=("drill_maintenance",))
        fleet_while_training(b, stack, run_id)
        shown = watch_run_in_grid(b, stack, run_id)
        states = {t: ti["state"] for t, ti in stack.api.task_instances(run_id).items()}
        assert shown == "success", f"the UI shows the run {shown!r}; tasks: {states}"
        run = stack.api.run(run_id)
        assert run["state"] == "success"
        assert params_changed_from_defaults(run["conf"]) == {"drill_maintenance": True}, run["conf"]
        run_key = naming.run_key(DAG_ID, run_id)

        # The drill happened in both stages, as the workload itself tells it.
        drills = recorded_drills(run_key)
        held = {stage: check_drill(run_key, stage, drills[stage]) for stage in STAGES}
        # ...and the UI shows it: the run_report task's log has one line per drill with the same facts.
        report = task_log_text(b, stack, run_id, "run_report", "maintenance events")
        assert "maintenance events: 2" in report, report[-3000:]
        for stage in STAGES:
            line = (
                f"- {stage}: maintenance ({drills[stage].get('notice_type') or 'no notice'}), "
                f"checkpoint step {held[stage]}, "
                f"downtime {drills[stage]['downtime_s']:.1f}s, steps recomputed 0, resumed from {held[stage]}"
            )
            assert line in report, (line, report[-3000:])

        links = extra_links(b, stack, run_id, "train")
        endpoint = stack.state["localcloud"]["api_endpoint"]
        assert all(url.startswith(endpoint + "/_localcloud/pages/") for url in links.values()), links

        machine = open_link(b, links["Machine"], "Machine")
        # Teardown deleted it: the local cloud's page shows its life, boot to deletion.
        assert run_key in machine and "DELETED" in machine and "machine_boot" in machine, machine[:2000]
        # The cloud's own history: one boot, then one per drill (simulateMaintenanceEvent restarts the machine).
        assert machine.count("machine_boot") == 3 and machine.count("maintenance_start") == 2, machine[:4000]
        checkpoints = open_link(b, links["Checkpoints"], "Checkpoints")
        assert f"{naming.checkpoint_prefix(run_key, 'train')}" in checkpoints, checkpoints[:2000]
        assert "checkpoints/60/commit_success.txt" in checkpoints, checkpoints[:3000]
        interlude_view_tells_the_same_story(b, stack, run_id, run_key)
    assert len(b.saved) >= 12 and all(p.stat().st_size > 0 for p in b.saved)


def test_a_bad_param_typed_in_the_form_fails_the_first_task_whose_log_names_it(stack: Stack, tmp_path: Any) -> None:
    """A bucket name GCS refuses (the form's schema cannot know): resolve_run fails, its log in the UI names the
    param, and the failure callback's advice is about params (nothing was created), not machines."""
    with chromium(tmp_path / "screenshots") as b:
        log_in(b, stack.state)
        run_id = submit_trigger_form(b, stack, typed={"bucket": "My Checkpoints"})
        shown = watch_run_in_grid(b, stack, run_id)
        states = {t: ti["state"] for t, ti in stack.api.task_instances(run_id).items()}
        assert shown == "failed", f"the UI shows the run {shown!r}; tasks: {states}"
        assert states["resolve_run"] == "failed", states
        assert states["teardown"] == "skipped", states
        ran = {t: s for t, s in states.items() if t != "resolve_run" and s in ("success", "running", "deferred")}
        assert not ran, f"tasks ran after the params were refused: {ran}"
        run_key = naming.run_key(DAG_ID, run_id)
        assert not [m for m in stack.machines() if m["name"].startswith(run_key)]

        log = task_log_text(b, stack, run_id, "resolve_run", "Bad input", expand="Post Execute")
        assert "bucket: 'My Checkpoints' is not a valid bucket name" in log, log[-3000:]
        start = log.index("Interlude: step 'resolve_run' failed")
        end = log.index("clearing this step would fail the same way", start)
        callback = log[start:end]
        assert "Fix the param(s) named above and trigger a new run" in callback, callback
        assert "machine" not in callback.lower() and "resume" not in callback.lower(), callback


def fleet_while_training(b: Browser, stack: Stack, run_id: str) -> None:
    """While the run's `train` task runs, the Fleet page lists the run's machine (in the zone provision chose)."""
    seen: dict[str, dict[str, Any]] = {}

    def training(run: dict[str, Any]) -> bool:
        return run["state"] in TERMINAL or (seen.get("train") or {}).get("state") in ("running", "deferred")

    stack.api.wait_run(run_id, RUN_TIMEOUT, until=training, on_poll=seen.update)
    assert (seen.get("train") or {}).get("state") in ("running", "deferred"), {t: ti["state"] for t, ti in seen.items()}
    machine = stack.api.call(
        "GET", f"dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}/taskInstances/provision/xcomEntries/return_value"
    )
    record = machine["value"] if isinstance(machine["value"], dict) else json.loads(machine["value"])
    b.page.goto(f"{stack.state['base_url']}/interlude/fleet")
    row = b.page.locator(f"tr.fleet-row[data-name='{record['name']}']")
    row.wait_for()
    b.screenshot("interlude-fleet")
    cells = row.locator("td").all_inner_texts()
    assert cells[:4] == [
        "TPU node" if record["kind"] == "tpu_node" else "GPU VM",
        record["name"],
        record["zone"],
        record["accelerator_type"],
    ], cells
    assert run_id in cells[4] and cells[8], cells  # its run, and what Interlude will do
    b.page.goto("about:blank")  # nothing left open to refresh while the run goes on


def committed_in_bucket(run_key: str, stage: str) -> list[int]:
    """The stage's finalised Orbax steps, from a raw listing of the bucket (not Interlude's checkpoint code)."""
    from interlude.training import events

    prefix = f"{naming.checkpoint_prefix(run_key, stage)}checkpoints/"
    names = [blob.name for blob in events.storage_client().list_blobs(DEFAULT_BUCKET, prefix=prefix)]
    return sorted(int(m[1]) for n in names if (m := re.fullmatch(re.escape(prefix) + r"(\d+)/commit_success\.txt", n)))


def interlude_view_tells_the_same_story(b: Browser, stack: Stack, run_id: str, run_key: str) -> None:
    """The Timeline extra link -> the run's picture; the UI's navigation -> the Runs page with the run's row."""
    from interlude.training import events
    from interlude_workload import layout

    report = json.loads(
        events.storage_client().bucket(DEFAULT_BUCKET).blob(layout.report_object(run_key)).download_as_bytes()
    )
    page, base = b.page, stack.state["base_url"]
    page.goto(f"{base}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/train/details")
    link = page.get_by_role("link", name="Timeline", exact=True)
    href = str(link.get_attribute("href"))
    assert href == f"{base.rstrip('/')}/interlude/timeline/{DAG_ID}/{quote(run_id, safe='')}", href
    response = page.goto(href)
    assert response is not None and response.status == 200, response and response.status
    picture = page.locator("svg.interlude-timeline")
    picture.wait_for()
    b.screenshot("interlude-timeline")
    assert picture.get_attribute("data-run-key") == run_key
    lanes = [page.locator("g.lane.stage").nth(i).get_attribute("data-stage") for i in range(2)]
    assert lanes == list(STAGES) and page.locator("g.lane.stage").count() == 2
    groups = page.locator("g.event")
    assert groups.count() == 2, "a band group per drill"
    assert sorted(groups.nth(i).get_attribute("data-stage") or "" for i in range(2)) == sorted(STAGES)
    for i in range(2):  # every drill took the machine down: its group has a "down" band
        assert groups.nth(i).locator("rect.band-down").count() == 1
    for stage in STAGES:
        committed = committed_in_bucket(run_key, stage)
        ticks = page.locator(f"g.lane.stage[data-stage='{stage}'] line.tick")
        assert [int(ticks.nth(i).get_attribute("data-step") or -1) for i in range(ticks.count())] == committed
    goodput = page.locator("svg.interlude-timeline text.goodput")
    assert goodput.get_attribute("data-goodput") == f"{report['goodput']:.4f}"
    shown = goodput.evaluate("text => text.firstChild.nodeValue")  # the figure; its <title> child is the hover
    assert shown.strip() == f"goodput {report['goodput']:.1%}", shown
    assert page.locator("li.event-line").count() == 2

    page.goto(f"{base}/plugin/interlude")  # the navigation entry: the Runs page in the UI's iframe
    page.get_by_text("Interlude", exact=True).first.wait_for()  # the entry in the navigation bar
    frame = page.frame_locator("iframe[title='Interlude']")
    row = frame.locator(f"tr.run[data-run-id='{run_id}']")
    row.wait_for()
    b.screenshot("interlude-runs")
    assert row.get_attribute("data-state") == "success"
    assert row.locator("td.events").inner_text().strip() == "2"
    assert row.locator("td.goodput").inner_text().strip() == f"{report['goodput']:.1%}"
    assert row.locator("td.steps").inner_text().strip() == "90 / 90"  # 60 train + 30 finetune, both done
    frame.locator("#filter-state").select_option("failed")
    frame.get_by_role("button", name="Filter").click()
    frame.locator("#filter-state option[value='failed'][selected]").wait_for(state="attached")  # the page it sent
    b.screenshot("interlude-runs-failed")
    assert frame.locator(f"tr.run[data-run-id='{run_id}']").count() == 0, "the state filter let a success through"


def test_the_interlude_view_refuses_requests_without_a_session(stack: Stack) -> None:
    """No cookie and no token: 401 on every page; a token Airflow did not sign: 403 (Airflow's own dependencies)."""
    base = stack.state["base_url"]
    for path in ("/interlude/runs", "/interlude/fleet", f"/interlude/timeline/{DAG_ID}/any-run", "/interlude/svg/x/y"):
        assert requests.get(base + path, timeout=30).status_code == 401, path
        forged = requests.get(base + path, headers={"Authorization": "Bearer not-a-jwt"}, timeout=30)
        assert forged.status_code == 403, (path, forged.status_code)
