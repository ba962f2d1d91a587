"""The Runs and Fleet pages' rows and HTML, and the Timeline extra link, without Airflow.

The HTML is parsed (html.parser), so the assertions are on rows and cells a browser would show.
"""

from __future__ import annotations

import datetime as dt
from html.parser import HTMLParser
from typing import Any

from interlude.operators.links import timeline_url
from interlude.serving.spec import ServeSpec
from interlude.ui import fleet, pages
from interlude.ui.runs import RunInfo, build_rows, serving_row, training_row

T0 = 1_765_000_000.0
SPEC = {"run_key": "interlude-training-m-abc", "bucket": "b", "train_steps": 60, "finetune_steps": 30}
MACHINE = {"kind": "tpu_node", "zone": "us-east5-a", "name": "k-node", "accelerator_type": "v6e-8", "mode": "spot"}


class Cells(HTMLParser):
    """Rows of <tr> with their attributes and cell texts."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[dict[str, str | None], list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append((dict(attrs), []))
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1][1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def rows_of(html: str, css: str) -> list[tuple[dict[str, str | None], list[str]]]:
    parser = Cells()
    parser.feed(html)
    return [r for r in parser.rows if r[0].get("class") == css]


def run(dag: str, run_id: str, state: str, start: float | None) -> RunInfo:
    return RunInfo(dag, run_id, state, start, None)


def test_a_finished_training_run_row_has_every_figure() -> None:
    xcoms = {
        "resolve_run": SPEC,
        "provision": MACHINE,
        "train": {"stage": "train", "final_step": 60},
        "finetune": {"stage": "finetune", "final_step": 30},
        "run_report": {"uri": "gs://b/r/report.json", "events": 2, "goodput": 0.9731, "steps_recomputed": 7},
    }
    row = training_row(run("interlude_training", "manual__1", "success", T0), xcoms)
    assert (row.platform, row.accelerator, row.zone, row.steps, row.events, row.goodput) == (
        "Cloud TPU",
        "v6e-8",
        "us-east5-a",
        "90 / 90",
        2,
        0.9731,
    )


def test_a_run_moved_by_a_failover_shows_where_it_ended_not_where_it_was_provisioned() -> None:
    moved = {"kind": "gce_vm", "name": "k-gce", "zone": "us-central2-b", "accelerator_type": "nvidia-l4"}
    train = {"stage": "train", "final_step": 60, "machine": moved}
    running = {"resolve_run": SPEC, "provision": MACHINE, "train": train}
    row = training_row(run("interlude_training", "m", "running", T0), running)
    assert (row.platform, row.accelerator, row.zone) == ("Compute Engine", "nvidia-l4", "us-central2-b")
    # the report says where the run ended (a second move in finetune): it wins over the stages
    last = {"kind": "tpu_node", "name": "k-tpu", "zone": "us-west4-a", "accelerator_type": "v5litepod-8"}
    done = {
        **running,
        "finetune": {"stage": "finetune", "final_step": 30, "machine": moved},
        "run_report": {"events": 3, "goodput": 0.8, "machine": last},
    }
    row = training_row(run("interlude_training", "m", "success", T0), done)
    assert (row.platform, row.accelerator, row.zone) == ("Cloud TPU", "v5litepod-8", "us-west4-a")
    # results from before the stages said where they ran: provision's machine, as before
    assert training_row(run("interlude_training", "o", "success", T0), {"provision": MACHINE}).zone == "us-east5-a"


def test_a_running_training_run_shows_what_is_known() -> None:
    row = training_row(
        run("interlude_training", "r", "running", T0), {"resolve_run": SPEC, "train": {"final_step": 60}}
    )
    assert (row.steps, row.events, row.goodput, row.accelerator) == ("60 / 90", None, None, "")
    bare = training_row(run("interlude_training", "q", "queued", None), {})
    assert (bare.steps, bare.platform) == ("", "")


def test_a_serving_row_counts_fallbacks_and_maintenance_steps_not_waits() -> None:
    xcoms = {
        "resolve": {"cluster": "interlude-serving", "location": "us-central1", "name": "interlude-vllm"},
        "rollout": {"fallbacks": [{"at": 1, "action": "fallback_to_gpu", "reason": "r"}]},
        "maintenance_watch": {"decisions": [{"kind": "wait"}, {"kind": "cordon"}, {"kind": "drain"}]},
        "report": {
            "pods_per_accelerator": {"gpu": 2, "tpu": 1},
            "fallbacks": [{"at": 1, "action": "fallback_to_gpu", "reason": "r"}],
            "requests_per_accelerator": {"gpu": {"answered": 40, "failed": 0}, "tpu": {"answered": 3, "failed": 0}},
        },
    }
    row = serving_row(run("interlude_serving", "s", "success", T0), xcoms)
    assert (row.platform, row.accelerator, row.zone, row.events) == (
        "GKE interlude-serving",
        "gpu x2, tpu x1",
        "us-central1",
        3,
    )
    assert row.detail == "answered: gpu 40, tpu 3; 1 fallback(s)"


def test_the_runs_page_lists_newest_first_with_links_and_filters() -> None:
    rows = build_rows(
        [
            (run("interlude_training", "old", "success", T0), {"resolve_run": SPEC}),
            (run("interlude_serving", "new", "failed", T0 + 60), {}),
            (run("interlude_training", "manual__2026-12-06T02:00:00+00:00", "running", T0 + 30), {}),
        ]
    )
    html = pages.runs_page("/interlude", rows, "interlude_training", "running")
    found = rows_of(html, "run")
    assert [a["data-run-id"] for a, _ in found] == ["new", "manual__2026-12-06T02:00:00+00:00", "old"]
    assert found[0][1][:3] == ["interlude_serving", "new", "failed"]
    assert 'href="/interlude/timeline/interlude_training/manual__2026-12-06T02%3A00%3A00%2B00%3A00"' in html
    assert '<option value="interlude_training" selected>' in html and '<option value="running" selected>' in html


def test_the_runs_page_escapes_what_the_run_says() -> None:
    evil = build_rows([(run("interlude_training", "<b>x</b>", "success", T0), {})])
    html = pages.runs_page("/interlude", evil, None, None)
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html


def test_the_extra_link_opens_the_runs_timeline_under_the_api_servers_base_url() -> None:
    url = timeline_url("http://127.0.0.1:8080/", "interlude_training", "manual__2026-12-06T02:00:00+00:00")
    assert (
        url == "http://127.0.0.1:8080/interlude/timeline/interlude_training/manual__2026-12-06T02%3A00%3A00%2B00%3A00"
    )
    assert timeline_url("", "d", "r") == "/interlude/timeline/d/r"


def rfc3339(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).isoformat().replace("+00:00", "Z")


def tpu_node(start: float, *, reschedule: bool = True, status: str = "PENDING") -> dict[str, Any]:
    return {
        "state": "READY",
        "upcomingMaintenance": {
            "type": "SCHEDULED",
            "maintenanceStatus": status,
            "windowStartTime": rfc3339(start),
            "windowEndTime": rfc3339(start + 3600),
            "canReschedule": reschedule,
        },
    }


def test_a_machine_with_a_notice_gets_the_stages_plan_for_it() -> None:
    record = {**MACHINE, "mode": "on_demand"}
    row = fleet.machine_row("interlude_training / r", record, tpu_node(T0 + 7200), T0)
    assert (row.what, row.window_start, row.window_end) == ("TPU node", T0 + 7200, T0 + 10800)
    assert row.notice == "SCHEDULED, PENDING, can start early"
    # plan_for_notice: the 60 s floor margin before the window, start early allowed (canReschedule, PENDING).
    assert row.action.startswith(f"checkpoint at {fleet.clock(T0 + 7200 - 60)} (60 s before the window")
    assert "start the maintenance early" in row.action
    ongoing = fleet.machine_row("r", record, tpu_node(T0 - 5, reschedule=False, status="ONGOING"), T0)
    assert ongoing.action.startswith(f"checkpoint at {fleet.clock(T0)}") and "hold until the window" in ongoing.action


def test_a_gpu_vm_reads_its_notice_from_resource_status_and_a_gone_machine_says_so() -> None:
    record = {**MACHINE, "kind": "gce_vm", "accelerator_type": "nvidia-l4", "mode": "on_demand"}
    vm = {"status": "RUNNING", "resourceStatus": {"upcomingMaintenance": tpu_node(T0 + 600)["upcomingMaintenance"]}}
    row = fleet.machine_row("r", record, vm, T0)
    assert (row.what, row.state, row.window_start) == ("GPU VM", "RUNNING", T0 + 600)
    gone = fleet.machine_row("r", record, None, T0)
    assert (gone.state, gone.window_start) == ("gone", None) and gone.action.startswith("gone")
    spot = fleet.machine_row("r", MACHINE, {"state": "READY"}, T0)
    assert "without notice" in spot.action


def test_a_tpu_vm_on_compute_engine_says_its_platform_and_machine_type() -> None:
    record = {
        **MACHINE,
        "kind": "gce_vm",
        "accelerator_type": "v6e-8",
        "machine_type": "ct6e-standard-8t",
        "mode": "on_demand",
        "platform": "compute",
    }
    vm = {"status": "RUNNING", "resourceStatus": {"upcomingMaintenance": tpu_node(T0 + 600)["upcomingMaintenance"]}}
    row = fleet.machine_row("r", record, vm, T0)
    assert (row.what, row.accelerator, row.window_start) == (
        "TPU VM (Compute Engine ct6e-standard-8t)",
        "v6e-8",
        T0 + 600,
    )
    assert 'data-what="TPU VM (Compute Engine ct6e-standard-8t)"' in pages.fleet_page("/interlude", [row], T0, [])


def gke_node(name: str, accelerator: str, maintenance_at: float | None) -> dict[str, Any]:
    labels = (
        {"cloud.google.com/gke-accelerator": "nvidia-l4"}
        if accelerator == "gpu"
        else {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}
    )
    if maintenance_at is not None:
        labels["cloud.google.com/scheduled-maintenance-time"] = str(int(maintenance_at))
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": rfc3339(T0 - 600)},
        "spec": {"nodeName": node},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(T0 - 500)}],
        },
    }


def test_serving_nodes_get_the_maintenance_watchs_steps_and_the_fleet_sorts_soonest_first() -> None:
    spec = ServeSpec.from_dict({"checkpoint_uri": "gs://b/interlude/k/finetune/export/"})
    nodes = [gke_node("gpu-a", "gpu", T0 + 900), gke_node("tpu-a", "tpu", None), gke_node("gpu-b", "gpu", None)]
    nodes.append({"metadata": {"name": "cpu-pool-1", "labels": {}}, "status": {}})  # no accelerator: not ours
    rows = fleet.node_rows("interlude_serving / s", spec, nodes, [pod("p1", "gpu-a"), pod("p2", "tpu-a")], T0)
    assert sorted(r.name for r in rows) == ["gpu-a", "gpu-b", "tpu-a"]
    gpu_a = next(r for r in rows if r.name == "gpu-a")
    assert gpu_a.window_start == T0 + 900 and gpu_a.state == "Ready, 1 pod(s)"
    # maintenance_plan's own steps for the node: no new replica there, a replacement elsewhere before the drain.
    assert gpu_a.action.startswith("cordon: maintenance at") and "; surge: 1 replacement(s)" in gpu_a.action
    assert next(r for r in rows if r.name == "tpu-a").action.startswith("none scheduled")
    machine = fleet.machine_row("interlude_training / r", {**MACHINE, "mode": "on_demand"}, tpu_node(T0 + 300), T0)
    ordered = fleet.soonest_first([*rows, machine])
    assert [r.name for r in ordered][:2] == ["k-node", "gpu-a"]  # +300 s, then +900 s; no window after
    html = pages.fleet_page("/interlude", ordered, T0, ["interlude_serving / x: TimeoutError"])
    found = rows_of(html, "fleet-row")
    assert [a["data-name"] for a, _ in found][:2] == ["k-node", "gpu-a"]
    assert "could not look: interlude_serving / x: TimeoutError" in html
