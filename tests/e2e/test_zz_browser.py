"""The Airflow UI on the production-shaped stack, used as a person would: headless chromium, loopback only.

Log in with the SimpleAuthManager admin, open the Trigger form of the lifecycle DAG, submit it as it
comes (every param at its default), and watch the run page (grid + run header) until the run is
successful. Then open the `train` task's Details, follow its extra links (the machine, the checkpoint
folder) in the same browser and check they resolve to the local cloud's pages for *this* run: the
machine's history ends in its deletion (teardown), the checkpoint folder lists COMMITTED steps.
Screenshots of every step land in the test's tmp dir and in var/artefacts/browser/.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import pytest

from interlude import naming
from tests.e2e.browser import Browser, chromium, is_loopback
from tests.e2e.stack_fixtures import DAG_ID, Stack

pytestmark = pytest.mark.e2e

RUN_TIMEOUT = 600.0  # the defaults (60 train + 30 finetune steps): ~1-2 min idle, 4.5 min at load average 10


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


def submit_trigger_form_with_defaults(b: Browser, stack: Stack) -> str:
    """Trigger -> the form as it comes -> Trigger. Returns the id of the run it created."""
    page = b.page
    before = manual_runs(stack)
    page.goto(f"{stack.state['base_url']}/dags/{DAG_ID}")
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Run Parameters").wait_for()
    b.screenshot("trigger-form")
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


def watch_run_in_grid(b: Browser, stack: Stack, run_id: str) -> str:
    """Reload the run's page until its header shows a final state; returns that state as the UI shows it."""
    page = b.page
    url = f"{stack.state['base_url']}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"
    page.goto(url)
    badge = page.get_by_test_id("header-card").get_by_test_id("state-badge")
    deadline = time.monotonic() + RUN_TIMEOUT
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


def test_trigger_form_with_defaults_runs_to_success_and_links_resolve(stack: Stack, tmp_path: Any) -> None:
    with chromium(tmp_path / "screenshots") as b:
        log_in(b, stack.state)
        run_id = submit_trigger_form_with_defaults(b, stack)
        shown = watch_run_in_grid(b, stack, run_id)
        states = {t: ti["state"] for t, ti in stack.api.task_instances(run_id).items()}
        assert shown == "success", f"the UI shows the run {shown!r}; tasks: {states}"
        assert stack.api.run(run_id)["state"] == "success"
        run_key = naming.run_key(DAG_ID, run_id)

        links = extra_links(b, stack, run_id, "train")
        endpoint = stack.state["localcloud"]["api_endpoint"]
        assert all(url.startswith(endpoint + "/_localcloud/pages/") for url in links.values()), links

        machine = open_link(b, links["Machine"], "Machine")
        # Teardown deleted it: the local cloud's page shows its life, boot to deletion.
        assert run_key in machine and "DELETED" in machine and "machine_boot" in machine, machine[:2000]
        checkpoints = open_link(b, links["Checkpoints"], "Checkpoints")
        assert f"{naming.checkpoint_prefix(run_key, 'train')}" in checkpoints, checkpoints[:2000]
        assert "step-00000060/COMMITTED" in checkpoints, checkpoints[:3000]
    assert len(b.saved) >= 6 and all(p.stat().st_size > 0 for p in b.saved)
