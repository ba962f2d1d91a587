"""Issue 36's must-show, on the PostgreSQL/Celery stack with headless chromium: the Interlude view after a training
run with two maintenance events and a failover, and who may see it.

The run (triggered through the REST API, every param the stack tests use): a SCHEDULED host maintenance with Google's
notice on its spot TPU in `train`, then its zone's capacity gone and the machine preempted (the run moves to the other
zone), then a SCHEDULED maintenance in `finetune` on the moved machine. While each notice is up, the Fleet page shows
the machine with its upcoming window and what Interlude will do (a screenshot each). After the run: the Runs page
(its row: the zone the run ended in, the report's events and goodput), the run's Timeline (a lane per stage, a band
group per maintenance, the failover move from the first zone to the other, the goodput figure), each checked against
facts that do not come from the view: the report in the bucket, the local cloud's own machine history, the committed
steps listed in the bucket. Screenshots land in var/artefacts/browser/interlude-view/.

A serving run on the same stack (its cluster: tests/e2e/stack_fixtures.py's scenario): no TPU for the replica, so
Interlude falls back to L4; the L4 node serving it then gets GKE's scheduled maintenance, and the Fleet page shows the
node with the watch's steps while the watch cordons, surges and drains it. The Runs row and the Timeline (the
fallback, the drain) are checked against the DAG's own records (the rollout's fallbacks, the watch's decisions) and
the cluster's events (GKE's failed TPU scale-up). Screenshots in var/artefacts/browser/interlude-view-serving/.

Who may see it: no session gets 401 on every page and the SVG; a logged-in user with no role (`outsider`, added by
include/scripts/stack.py), by bearer token and by the UI's own login in the browser, gets 403 on every one of them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import pytest
import requests

from interlude import naming
from tests.e2e.browser import Browser, chromium
from tests.e2e.stack_fixtures import BUCKET, DAG_ID, DATA_DATE, POLL_SECONDS, TERMINAL, Stack
from tests.e2e.test_zz_browser import log_in

pytestmark = pytest.mark.e2e

HOME, OTHER = "us-central1-a", "us-central2-b"
SHOTS = "interlude-view"  # var/artefacts/browser/interlude-view/
RUN_TIMEOUT = 1200.0
# Google's notice for a TPU's scheduled maintenance is at least a week in truth; here 4 h of the scenario's clock
# (24 s at 600x), long enough for a loaded machine to open the Fleet page while it is up.
NOTICE_S = 4 * 3600
CONF: dict[str, Any] = {
    "bucket": BUCKET,
    "data_date": DATA_DATE,
    "train_steps": 400,  # 40 s of steps at least: the first notice's window comes while it trains
    "finetune_steps": 300,
    "checkpoint_every": 10,
    "step_seconds": 0.1,
    "poll_seconds": 0.5,
    "model_size": "tiny",
    "spot": True,
    "zones": [HOME, OTHER],
}
PAGES = ("/interlude/", "/interlude/runs", f"/interlude/runs?dag_id={DAG_ID}", "/interlude/fleet")


def admin(stack: Stack) -> Any:
    from interlude_localcloud.testing import Admin

    return Admin(stack.state["localcloud"]["api_endpoint"])


def progress(run_key: str, stage: str) -> dict[str, Any]:
    from interlude_workload.checkpoints import CheckpointStore

    return CheckpointStore(BUCKET, run_key, stage).read_progress() or {}


def run_machine(stack: Stack, run_key: str, zone: str) -> dict[str, Any] | None:
    """The run's READY TPU node in `zone`, from the local cloud's own list."""
    for m in admin(stack).machines():
        if m["name"].startswith(run_key) and m["zone"] == zone and m["kind"] == "tpu" and m["state"] == "READY":
            return dict(m)
    return None


def wait_for(stack: Stack, run_id: str, what: str, check: Callable[[], Any], timeout: float = 600) -> Any:
    """Poll `check` until it returns something truthy; fail if the run ends first or the time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        run = stack.api.run(run_id)
        if run["state"] in TERMINAL:
            states = {t: ti["state"] for t, ti in stack.api.task_instances(run_id).items()}
            raise AssertionError(f"the run ended ({run['state']}) before {what}: {states}")
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"{what}: not within {timeout:.0f}s")


def resumed_and_stepping(stack: Stack, run_key: str) -> dict[str, Any] | None:
    """The run's machine in the first zone once a new boot resumed train and stepped 20 past its resume point (the
    stage has closed the maintenance event by then: a preemption now is an event of its own)."""
    machine = run_machine(stack, run_key, HOME)
    now = progress(run_key, "train")
    resumed = int(now.get("resumed_from") or 0)
    if machine and machine["boots"] >= 2 and resumed and int(now.get("step") or 0) >= resumed + 20:
        return machine
    return None


def announce(stack: Stack, machine: dict[str, Any]) -> None:
    admin(stack).maintenance("tpu", machine["zone"], machine["name"], type="SCHEDULED", notice_seconds=NOTICE_S)


def fleet_shows_the_notice(b: Browser, stack: Stack, run_id: str, machine: dict[str, Any], shot: str) -> list[str]:
    """The Fleet page lists the machine with its upcoming window and Interlude's plan for it; returns its cells."""
    page = b.page
    row = page.locator(f"tr.fleet-row[data-name='{machine['name']}']")
    deadline = time.monotonic() + 60
    while True:
        page.goto(f"{stack.state['base_url']}/interlude/fleet")
        if row.count() and row.get_attribute("data-window-start"):
            break
        assert time.monotonic() < deadline, "the Fleet page never showed the machine's upcoming maintenance"
        time.sleep(1)
    b.screenshot(shot)
    cells = row.locator("td").all_inner_texts()
    assert cells[:3] == ["TPU node", machine["name"], machine["zone"]], cells
    assert run_id in cells[4] and "SCHEDULED" in cells[7], cells
    assert cells[8].startswith("checkpoint at "), cells  # the stage's plan for this notice (plan_for_notice)
    return cells


def drive_the_run(b: Browser, stack: Stack, run_id: str, run_key: str) -> list[str]:
    """Maintenance in train (Fleet shot), the failover, maintenance in finetune on the moved machine (Fleet shot)."""
    cloud = admin(stack)
    done = []
    first = wait_for(
        stack,
        run_id,
        "train reached step 15 on its first machine",
        lambda: int(progress(run_key, "train").get("step") or 0) >= 15 and run_machine(stack, run_key, HOME),
    )
    announce(stack, first)
    done.append(f"maintenance announced on {first['name']}")
    fleet_shows_the_notice(b, stack, run_id, first, "fleet-upcoming-maintenance-train")
    b.page.goto("about:blank")
    after = wait_for(  # the maintenance came and went: a new boot resumed and trained 20 steps past its resume point
        stack, run_id, "train stepping again after the maintenance", lambda: resumed_and_stepping(stack, run_key)
    )
    for tpu_type in ("v6e-8", "v5litepod-8"):
        cloud.set_capacity(HOME, "tpu", tpu_type, on_demand=0, spot=0)
    cloud.preempt("tpu", HOME, after["name"])
    done.append(f"{HOME} out of TPUs, {after['name']} preempted")
    moved = wait_for(
        stack,
        run_id,
        "finetune at step 10 on the machine in the other zone",
        lambda: int(progress(run_key, "finetune").get("step") or 0) >= 10 and run_machine(stack, run_key, OTHER),
        timeout=900,
    )
    announce(stack, moved)
    done.append(f"maintenance announced on {moved['name']}")
    fleet_shows_the_notice(b, stack, run_id, moved, "fleet-upcoming-maintenance-finetune-moved")
    b.page.goto("about:blank")
    return done


def report_of(run_key: str) -> dict[str, Any]:
    from interlude.training import events
    from interlude_workload import layout

    raw = events.storage_client().bucket(BUCKET).blob(layout.report_object(run_key)).download_as_bytes()
    return dict(json.loads(raw))


def runs_page_row(b: Browser, stack: Stack, run_id: str, report: dict[str, Any]) -> None:
    page = b.page
    page.goto(f"{stack.state['base_url']}/interlude/runs?dag_id={DAG_ID}")
    row = page.locator(f"tr.run[data-run-id='{run_id}']")
    row.wait_for()
    b.screenshot("runs")
    assert row.get_attribute("data-state") == "success"
    cells = row.locator("td").all_inner_texts()
    assert report["zone"] == OTHER, report["zone"]
    assert OTHER in cells and HOME not in cells, cells  # where the run ended up after the move
    assert row.locator("td.events").inner_text().strip() == str(len(report["events"]))
    assert row.locator("td.goodput").inner_text().strip() == f"{report['goodput']:.1%}"
    total = CONF["train_steps"] + CONF["finetune_steps"]
    assert row.locator("td.steps").inner_text().strip() == f"{total} / {total}"


def timeline_page(b: Browser, stack: Stack, run_id: str, run_key: str, report: dict[str, Any]) -> None:
    page, base = b.page, stack.state["base_url"]
    page.goto(f"{base}/interlude/runs?dag_id={DAG_ID}")
    page.locator(f"tr.run[data-run-id='{run_id}'] a.timeline-link").click()  # from the Runs page, as a person does
    page.wait_for_url(f"**/interlude/timeline/{DAG_ID}/**")
    picture = page.locator("svg.interlude-timeline")
    picture.wait_for()
    b.screenshot("timeline")
    assert picture.get_attribute("data-run-key") == run_key
    lanes = page.locator("g.lane.stage")
    assert [lanes.nth(i).get_attribute("data-stage") for i in range(lanes.count())] == ["train", "finetune"]
    # a band group per recorded event that is not a move, each where the report puts it
    recorded = [(e["stage"], e["kind"]) for e in report["events"] if e["kind"] != "move"]
    assert recorded.count(("train", "maintenance")) == 1 and recorded.count(("finetune", "maintenance")) == 1
    groups = page.locator("g.event")
    drawn = [
        (groups.nth(i).get_attribute("data-stage"), groups.nth(i).get_attribute("data-kind"))
        for i in range(groups.count())
    ]
    assert sorted(drawn) == sorted(recorded), (drawn, recorded)
    maintenance = page.locator("g.event[data-kind='maintenance']")
    for i in range(maintenance.count()):  # each took the machine down: a notice band and a down band
        assert maintenance.nth(i).locator("rect.band-notice").count() == 1
        assert maintenance.nth(i).locator("rect.band-down").count() == 1
    # the failover move: from the first zone to the other, on train's lane
    (move,) = [e for e in report["events"] if e["kind"] == "move"]
    assert move["from_zone"] == HOME and move["to"].endswith(f"in {OTHER}"), move
    marks = page.locator("g.move")
    assert marks.count() == 1
    assert HOME in (marks.first.get_attribute("data-from") or "") and OTHER in (
        marks.first.get_attribute("data-to") or ""
    )
    assert page.locator("li.move-line").count() == 1 and OTHER in page.locator("li.move-line").inner_text()
    for stage in ("train", "finetune"):  # a tick per committed checkpoint Orbax kept, as the bucket lists them
        ticks = page.locator(f"g.lane.stage[data-stage='{stage}'] line.tick")
        steps = [int(ticks.nth(i).get_attribute("data-step") or -1) for i in range(ticks.count())]
        assert steps == committed_in_bucket_of(run_key, stage), (stage, steps)
    goodput = page.locator("svg.interlude-timeline text.goodput")
    assert goodput.get_attribute("data-goodput") == f"{report['goodput']:.4f}"
    shown = goodput.evaluate("text => text.firstChild.nodeValue")
    assert shown.strip() == f"goodput {report['goodput']:.1%}", shown


def committed_in_bucket_of(run_key: str, stage: str) -> list[int]:
    """The stage's finalised Orbax steps, from a raw listing of the bucket (not Interlude's checkpoint code)."""
    import re

    from interlude.training import events

    prefix = f"{naming.checkpoint_prefix(run_key, stage)}checkpoints/"
    names = [blob.name for blob in events.storage_client().list_blobs(BUCKET, prefix=prefix)]
    return sorted(int(m[1]) for n in names if (m := re.fullmatch(re.escape(prefix) + r"(\d+)/commit_success\.txt", n)))


def test_after_two_maintenance_events_and_a_failover_the_three_pages_tell_the_story(
    stack: Stack, tmp_path: Any
) -> None:
    with chromium(tmp_path / "screenshots", SHOTS) as b:
        log_in(b, stack.state)
        run_id = stack.api.trigger(CONF)
        run_key = naming.run_key(DAG_ID, run_id)
        done = drive_the_run(b, stack, run_id, run_key)
        run = stack.api.wait_run(run_id, RUN_TIMEOUT)
        states = {t: ti["state"] for t, ti in stack.api.task_instances(run_id).items()}
        assert run["state"] == "success", (done, states)

        report = report_of(run_key)
        # The cloud's own history: machines booted in the first zone, then in the other (the move), none left.
        booted = [str(e["machine"]) for e in admin(stack).events() if e.get("event") == "machine_boot"]
        mine = [m for m in booted if run_key in m]
        assert mine and mine[0].startswith(f"tpu-{HOME}-") and mine[-1].startswith(f"tpu-{OTHER}-"), mine
        assert not [m for m in stack.machines() if m["name"].startswith(run_key)]
        runs_page_row(b, stack, run_id, report)
        timeline_page(b, stack, run_id, run_key, report)
    assert len(b.saved) >= 5 and all(p.stat().st_size > 0 for p in b.saved)


def test_no_session_gets_401_and_a_user_without_a_role_403_on_every_page(stack: Stack, tmp_path: Any) -> None:
    """No session: 401 on every page and the SVG. The user with no role, by token and by the UI's login: 403.

    The timeline's run need not exist: Airflow's dependencies answer before the page looks for it."""
    base, run_id = stack.state["base_url"], "manual__2024-01-15T00:00:00+00:00"
    paths = [*PAGES, *(f"/interlude/{kind}/{DAG_ID}/{quote(run_id, safe='')}" for kind in ("timeline", "svg"))]
    token = stack.module.api_token(stack.state, "outsider")
    for path in paths:
        assert requests.get(base + path, timeout=30, allow_redirects=False).status_code == 401, path
        outsider = requests.get(
            base + path, headers={"Authorization": f"Bearer {token}"}, timeout=30, allow_redirects=False
        )
        assert outsider.status_code == 403, (path, outsider.status_code, outsider.text[:300])
    with chromium(tmp_path / "screenshots", SHOTS + "-refused") as b:  # the UI's own login form and session cookie
        log_in(b, {**stack.state, "auth": stack.state["outsider"]})
        for path in paths:
            response = b.page.goto(base + path)
            assert response is not None and response.status == 403, (path, response and response.status)
        b.screenshot("outsider-refused")


SERVING_DAG, CLUSTER, L4 = "interlude_serving", "interlude-serving", "nvidia-l4"
SERVING_SHOTS = "interlude-view-serving"  # var/artefacts/browser/interlude-view-serving/
# Scenario seconds from the notice to GKE's own start of the node's maintenance: 36 s at 600x, inside the watch.
WINDOW_IN = 6 * 3600


@contextmanager
def serving_cluster(stack: Stack) -> Iterator[Any]:
    """A kubernetes client for the stack's serving cluster, through the stack's own Google connection."""
    from interlude.hooks.gke import GKEHook

    env = stack.module.component_env(stack.state)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])
        hook = GKEHook(location="us-central1")
        with hook.kubernetes_hook(CLUSTER, project_id=stack.state["localcloud"]["project"]).get_conn() as api:
            yield api


def serving_export() -> str:
    """A Hugging Face export (a fresh reference model) in the stack's bucket, as the training chain leaves one."""
    from interlude.training import events
    from tests.e2e.test_serving_dag import local_export
    from tests.include.serving.standin_proc import upload_export

    return upload_export(local_export(), events.storage_client(), BUCKET, "interlude/serve-view/finetune/export")


def l4_node_serving(api: Any) -> str | None:
    """The L4 node a Running serving pod is on (the pods' own records in the cluster)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    for pod in core.list_namespaced_pod("default", label_selector="app.kubernetes.io/name=interlude-vllm").items:
        if pod.status.phase == "Running" and pod.spec.node_name:
            labels = core.read_node(pod.spec.node_name).metadata.labels or {}
            if labels.get("cloud.google.com/gke-accelerator") == L4:
                return str(pod.spec.node_name)
    return None


def test_a_serving_run_with_a_fallback_and_a_drained_node_in_the_interlude_view(stack: Stack, tmp_path: Any) -> None:
    """No TPU for the replica (no v6e-1 capacity, GKE's TPU wait 10 h): Interlude falls back to L4. Then the L4 node
    serving it gets GKE's scheduled maintenance: the Fleet page shows the node and the watch's steps (screenshot),
    the watch cordons, surges and drains it. After the run, the Timeline shows the fallback and the drain, each as
    the DAG's own records say (the rollout's fallbacks, the watch's decisions), and the Runs row counts them."""
    uri = serving_export()
    stack.api.unpause(SERVING_DAG)
    try:
        conf = {
            "checkpoint_uri": uri,
            "rollout_timeout_seconds": 600,
            "fallback_after_seconds": 60,
            # Cluster seconds: at the stack's 600x the default 15 minutes pass in 1.5 s and the run would go back to
            # TPU-first (and fall back again) while it serves; a day keeps the one fallback this run is about.
            "tpu_retry_seconds": 86400,
            "poll_seconds": 1,
            "watch_minutes": 1.0,
        }
        run_id = stack.api.trigger(conf, dag_id=SERVING_DAG)
        with chromium(tmp_path / "screenshots", SERVING_SHOTS) as b, serving_cluster(stack) as api:
            log_in(b, stack.state)
            deadline = time.monotonic() + 600
            node = None
            while node is None:
                node = l4_node_serving(api)
                assert stack.api.run(run_id, SERVING_DAG)["state"] not in TERMINAL or node, "ended before serving"
                assert time.monotonic() < deadline, "no serving pod Running on an L4 node"
                time.sleep(POLL_SECONDS)
            window = admin(stack).gke_node_maintenance(CLUSTER, node, notice_in=0, window_in=WINDOW_IN)
            page = b.page
            row = page.locator(f"tr.fleet-row[data-name='{node}']")
            page.goto(f"{stack.state['base_url']}/interlude/fleet")
            row.wait_for()
            b.screenshot("fleet-gke-node-maintenance")
            cells = row.locator("td").all_inner_texts()
            assert cells[0] == "GKE node" and L4 in cells[3] and run_id in cells[4], cells
            assert row.get_attribute("data-window-start"), cells  # the node's scheduled-maintenance-time
            assert cells[7] == "scheduled-maintenance-time" and cells[8], cells
            page.goto("about:blank")
            run = stack.api.wait_run(run_id, RUN_TIMEOUT, dag_id=SERVING_DAG)
            states = {t: ti["state"] for t, ti in stack.api.task_instances(run_id, SERVING_DAG).items()}
            assert run["state"] == "success", states
            rollout = xcom(stack, run_id, "rollout")
            watch = xcom(stack, run_id, "maintenance_watch")
            fallbacks = [f["action"] for f in rollout["fallbacks"]]
            assert fallbacks == ["fall_back_to_gpu"], rollout["fallbacks"]
            drained = [d for d in watch["decisions"] if d["kind"] == "drain" and d.get("node") == node]
            assert drained, [(d["kind"], d.get("node")) for d in watch["decisions"]]
            events = admin(stack).gke_events(CLUSTER)["events"]
            assert any(e["kind"] == "ScaleUpFailed" for e in events), events[-20:]  # the TPU stockout, by GKE
            assert not [e for e in events if e["kind"] == "Evicted" and e.get("node") == node and e["t"] >= window]

            page.goto(f"{stack.state['base_url']}/interlude/runs?dag_id={SERVING_DAG}")
            runs_row = page.locator(f"tr.run[data-run-id='{run_id}']")
            runs_row.wait_for()
            b.screenshot("runs-serving")
            steps = [d for d in watch["decisions"] if d.get("kind") not in ("wait",)]
            assert runs_row.locator("td.events").inner_text().strip() == str(len(fallbacks) + len(steps))
            runs_row.locator("a.timeline-link").click()
            page.wait_for_url(f"**/interlude/timeline/{SERVING_DAG}/**")
            page.locator("svg.interlude-timeline").wait_for()
            b.screenshot("timeline-serving")
            assert page.locator("svg.interlude-timeline g.fallback").count() == 1
            assert "fall_back_to_gpu" in page.locator("li.fallback-line").inner_text()
            lines = page.locator("li.node-step-line").all_inner_texts()
            assert any(line.startswith(f"drain {node}") for line in lines), lines
            assert page.locator("svg.interlude-timeline g.node-step").count() == len(lines)
            lanes = page.locator("g.lane.pods")
            kinds = {lanes.nth(i).get_attribute("data-accelerator") for i in range(lanes.count())}
            assert "gpu" in kinds, kinds  # the pods per accelerator the report counted
    finally:
        stack.api.call("PATCH", f"dags/{SERVING_DAG}", json={"is_paused": True})  # no asset-triggered runs later


def xcom(stack: Stack, run_id: str, task_id: str) -> Any:
    body = stack.api.call(
        "GET",
        f"dags/{SERVING_DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task_id}/xcomEntries/return_value",
    )
    value = body["value"]
    return json.loads(value) if isinstance(value, str) else value
