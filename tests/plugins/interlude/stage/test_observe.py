"""Folding Google's node and instance states into READY / DOWN / GONE, and notices."""

from __future__ import annotations

import pytest

from interlude.stage.model import Machine
from interlude.stage.observe import StageFacts, gce_machine, observation, progress_line, tpu_machine

NOTICE = {"type": "SCHEDULED", "maintenanceStatus": "PENDING", "windowStartTime": "2026-12-02T12:00:00Z"}


@pytest.mark.parametrize(
    ("node", "machine"),
    [
        (None, Machine.GONE),
        ({"state": "READY", "health": "HEALTHY"}, Machine.READY),
        ({"state": "READY"}, Machine.READY),
        ({"state": "READY", "health": "UNHEALTHY_MAINTENANCE"}, Machine.DOWN),
        ({"state": "REPAIRING", "health": "UNHEALTHY_MAINTENANCE"}, Machine.DOWN),
        ({"state": "STOPPED"}, Machine.DOWN),
        ({"state": "CREATING"}, Machine.DOWN),
        ({"state": "TERMINATED"}, Machine.DOWN),
        ({"state": "PREEMPTED"}, Machine.GONE),
        (
            {"state": "READY", "health": "HEALTHY", "upcomingMaintenance": {**NOTICE, "maintenanceStatus": "ONGOING"}},
            Machine.DOWN,
        ),
    ],
)
def test_tpu_states(node, machine) -> None:
    assert tpu_machine(node)[0] is machine


def test_tpu_notice_is_read() -> None:
    machine, notice = tpu_machine({"state": "READY", "health": "HEALTHY", "upcomingMaintenance": NOTICE})
    assert machine is Machine.READY and notice and notice.kind == "SCHEDULED" and notice.status == "PENDING"


@pytest.mark.parametrize(
    ("instance", "machine"),
    [
        (None, Machine.GONE),
        ({"status": "RUNNING"}, Machine.READY),
        ({"status": "STAGING"}, Machine.DOWN),
        ({"status": "TERMINATED", "scheduling": {"automaticRestart": True}}, Machine.DOWN),
        ({"status": "TERMINATED", "scheduling": {"automaticRestart": False}}, Machine.GONE),
        (
            {"status": "TERMINATED", "scheduling": {"provisioningModel": "SPOT", "automaticRestart": False}},
            Machine.GONE,
        ),
        (
            {
                "status": "RUNNING",
                "resourceStatus": {"upcomingMaintenance": {**NOTICE, "maintenanceStatus": "ONGOING"}},
            },
            Machine.DOWN,
        ),
    ],
)
def test_gce_states(instance, machine) -> None:
    assert gce_machine(instance)[0] is machine


def test_observation_reads_progress_and_workload_failure() -> None:
    facts = StageFacts(
        20, {"step": 23, "resumed_from": 20, "boot_id": "b", "state": "failed", "error": "no data"}, None
    )
    obs = observation("tpu_node", {"state": "READY"}, facts, now=5.0)
    assert (obs.committed_step, obs.progress_step, obs.resumed_from, obs.boot_id) == (20, 23, 20, "b")
    assert obs.workload_error == "no data"


def test_progress_line() -> None:
    line = progress_line("train", {"step": 5, "total_steps": 10, "loss": 0.5, "steps_per_second": 2, "eta_seconds": 3})
    assert line == "[train] step 5/10  loss 0.50000  2.00 steps/s  ETA 3s"


# ------------------------------------------------------------------ the serial console's startup verdict
from interlude.stage.observe import startup_failure  # noqa: E402

BOOT1 = "2026-12-02T10:00:00Z startup: begin: boot b-1\n"


def test_a_startup_script_that_ended_on_the_latest_boot_is_a_failure() -> None:
    serial = (
        BOOT1 + "2026-12-02T10:00:01Z startup: python3 cannot import interlude_workload\n"
        "2026-12-02T10:00:01Z startup: end (exit 3) boot b-1\n"
    )
    failure = startup_failure(serial)
    assert failure is not None and failure.boot == "b-1" and failure.exit_code == 3
    assert "cannot import interlude_workload" in failure.summary()


def test_googles_own_exit_status_line_counts_too() -> None:
    serial = BOOT1 + "Dec 02 10:00:02 vm google_metadata_script_runner[9]: startup-script exit status 127\n"
    assert startup_failure(serial).exit_code == 127  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "serial",
    [
        "",  # nothing yet
        BOOT1 + "agent: starting stage train\n",  # still running
        BOOT1 + "x startup: SIGTERM: forwarding to trainer 12\nx startup: end (exit 0) boot b-1\n"
        "x startup: begin: boot b-2\n",  # a new boot runs
        # the old boot's last words arrive after the new boot's first (seen on the local cloud's GPU VMs)
        BOOT1 + "x startup: SIGTERM: forwarding\nx startup: begin: boot b-2\nx startup: end (exit 0) boot b-1\n",
    ],
)
def test_running_booting_or_shutting_down_is_not_a_failure(serial: str) -> None:
    assert startup_failure(serial) is None


@pytest.mark.parametrize(
    ("kind", "doc", "schema"), [("tpu_node", "tpu.v2", "ListNodesResponse"), ("gce_vm", "compute.v1", "InstanceList")]
)
def test_a_watchers_zone_list_asks_only_for_fields_google_declares(kind: str, doc: str, schema: str) -> None:
    """Google refuses a ``fields`` naming an undeclared field (400): checked against the API's discovery document.
    And every field the machine view reads is asked for (a field left out would read as absent: no notice)."""
    from interlude.stage.observe import WATCH_FIELDS, list_fields
    from interlude_localcloud import partial

    selection = partial.parse(list_fields(kind))
    partial.check(doc, schema, selection)
    items = selection["nodes" if kind == "tpu_node" else "items"]
    assert items is not None and set(items) == set(WATCH_FIELDS[kind]) and "nextPageToken" in selection


def test_stage_facts_follow_the_process_to_another_gcs_endpoint(gcs_emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared storage client is per endpoint: after a process is pointed at another GCS (a second local
    cloud), its stage reads reach that one's buckets, not the first's (seen: 404 "bucket does not exist" when
    test_facts ran before test_stage_actions in one process)."""
    from interlude.stage.observe import read_stage_facts
    from interlude_workload.testing import running_gcs_emulator

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    gcs_emulator.create_bucket("first-cloud")
    assert read_stage_facts("first-cloud", "run", "train", None).committed_step == 0
    with running_gcs_emulator() as second:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", second.endpoint)
        second.create_bucket("second-cloud")
        assert read_stage_facts("second-cloud", "run", "train", None).committed_step == 0
