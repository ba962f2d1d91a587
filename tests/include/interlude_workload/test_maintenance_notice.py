"""A maintenance notice on a machine of the real local cloud: checkpoint at once, hold, zero recompute.

The trainer runs as the startup script of a TPU node of the local cloud and watches that machine's own
metadata server. simulateMaintenanceEvent (TPU v2alpha1, the real discovery-based client) gives a
scheduled notice a few seconds ahead; the node then goes down (SIGTERM to its processes), comes back
and runs its startup script again.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2
from googleapiclient.discovery import build

from interlude_localcloud.scenario import parse
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud
from interlude_workload.checkpoints import CheckpointStore
from interlude_workload.startup import render

from .trainer_proc import digest_of, run_trainer, trainer_cmd

ZONE = "us-central1-a"
STEPS = 150
# time_scale 600: the scheduled notice of 1800 simulated seconds is 3 s of real time, the window 1 s.
SCENARIO: dict[str, Any] = {
    "project": "wl-proj",
    "time_scale": 600,
    "stop_grace_seconds": 3,
    "zones": {
        ZONE: {
            "region": "us-central1",
            "tpu": {
                "accelerator_types": ["v6e-8"],
                "runtime_versions": ["v2-alpha-tpuv6e"],
                "capacity": {"v6e-8": {"on_demand": 2, "spot": 2}},
            },
            "gpu": {
                "accelerator_types": ["nvidia-l4"],
                "machine_types": ["g2-standard-4"],
                "capacity": {"nvidia-l4": {"on_demand": 2, "spot": 2}},
            },
        }
    },
    "regions": {"us-central1": {"quotas": {"NVIDIA_L4_GPUS": 2}}},
    "delays": {"tpu_create": 60, "tpu_delete": 60, "gce_create": 60, "gce_delete": 60},
    "maintenance": {
        "tpu": {"scheduled_notice": 1800, "unscheduled_notice": 600, "duration": 600},
        "gce": {"scheduled_notice": 1800, "unscheduled_notice": 600, "duration": 600},
    },
}


def until(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def cloud(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[RunningLocalCloud]:
    with running_localcloud(parse(SCENARIO), state_dir=tmp_path / "cloud") as lc:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", lc.gcs_endpoint)
        yield lc


def _stamp(line: str) -> float:
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def _start_tpu_node(cloud: RunningLocalCloud, script: str) -> Callable[[], None]:
    """A TPU node running ``script``; returns how to announce maintenance (TPU v2alpha1, discovery client)."""
    tpu = tpu_v2.TpuClient(
        transport="rest", client_options={"api_endpoint": cloud.api_endpoint}, credentials=AnonymousCredentials()
    )
    parent = f"projects/{cloud.project}/locations/{ZONE}"
    node = tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e", metadata={"startup-script": script})
    tpu.create_node(parent=parent, node_id="trainer", node=node).result(timeout=30)
    alpha = build(
        "tpu",
        "v2alpha1",
        credentials=AnonymousCredentials(),
        static_discovery=True,
        client_options={"api_endpoint": cloud.api_endpoint},
    )
    return lambda: (
        alpha.projects()
        .locations()
        .nodes()
        .simulateMaintenanceEvent(name=f"{parent}/nodes/trainer", body={"workerIds": ["0"]})
        .execute()
    )


def _start_gpu_vm(cloud: RunningLocalCloud, script: str) -> Callable[[], None]:
    """A GPU VM (compute_v1) running ``script``; returns how to announce maintenance."""
    from google.cloud import compute_v1  # here, not at the top: see localcloud/conftest.py

    opts, creds = {"api_endpoint": cloud.api_endpoint}, AnonymousCredentials()
    instances = compute_v1.InstancesClient(client_options=opts, credentials=creds)
    ops = compute_v1.ZoneOperationsClient(client_options=opts, credentials=creds)
    vm = compute_v1.Instance(
        name="trainer",
        machine_type=f"zones/{ZONE}/machineTypes/g2-standard-4",
        scheduling=compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=True),
        metadata=compute_v1.Metadata(items=[compute_v1.Items(key="startup-script", value=script)]),
    )
    op = instances.insert(project=cloud.project, zone=ZONE, instance_resource=vm)
    ops.wait(project=cloud.project, zone=ZONE, operation=op.name)  # not op.result(): it polls Google
    # withExtendedNotifications: the notice first, as Google gives it before real GPU maintenance
    return lambda: instances.simulate_maintenance_event(
        request={"project": cloud.project, "zone": ZONE, "instance": "trainer", "with_extended_notifications": True}
    )


@pytest.mark.parametrize("start_machine", [_start_tpu_node, _start_gpu_vm], ids=["tpu-node", "gpu-vm"])
def test_notice_commits_before_the_machine_goes_down_and_nothing_is_recomputed(
    cloud: RunningLocalCloud, start_machine: Callable[[RunningLocalCloud, str], Callable[[], None]]
) -> None:
    from interlude_workload.gcs import storage_client

    bucket = f"wl-{uuid.uuid4().hex[:10]}"
    storage_client().create_bucket(bucket)
    script = render(
        bucket=bucket,
        run_key="mnt",
        stage="train",
        steps=STEPS,
        checkpoint_every=1000,
        seed=5,
        step_seconds=0.04,
        keep=100,
        hold_margin_seconds=1.0,
    )
    announce_maintenance = start_machine(cloud, script)
    store = CheckpointStore(bucket, "mnt", "train")
    until(lambda: int((store.read_progress() or {}).get("step") or 0) >= 15, 30, "training progress")

    announce_maintenance()

    until(lambda: any(e["event"] == "maintenance_end" for e in cloud.admin.events()), 30, "maintenance end")
    final = until(
        lambda: (c := store.latest().checkpoint) is not None and c.step == STEPS and c,
        60,
        "final checkpoint after the reboot",
    )
    log = until(lambda: (t := store.read_log()) and "final digest" in t and t, 10, "final log chunk")
    events = cloud.admin.events()
    down = next(e["t"] for e in events if e["event"] == "machine_down" and e.get("reason") == "maintenance")

    # 1. The notice produced a committed checkpoint at once, with the latency printed: of the first step finished
    # after it, no other step trained between the notice and that commit (the trainer logs every 10th step and
    # every step it commits; a step finished before the notice can be logged just after it).
    latency = re.search(r"notice-to-commit (\d+\.\d+)s \(step (\d+)\)", log)
    assert latency, log[-4000:]
    notice_step = int(latency.group(2))
    lines = log.splitlines()
    noticed = next(i for i, line in enumerate(lines) if re.search(r"metadata notice: (?!none)", line))
    committed = next(i for i, line in enumerate(lines) if f"checkpoint step {notice_step} committed" in line)
    stepped = {int(n) for line in lines[noticed:committed] for n in re.findall(r"\bstep (\d+)/\d+ loss", line)}
    assert noticed < committed and stepped <= {notice_step - 1, notice_step}, lines[noticed : committed + 1]
    assert "(notice)" in lines[committed], lines[committed]
    # 2. Training went on, then stopped stepping at a committed step as the window came (the "maintenance-hold"
    # commit): nothing it computed after that step could be lost. Its "holding" line comes after that commit;
    # when the commit ran past the hold margin (a loaded host: 1.1 s of a 1.0 s margin once), the machine went
    # down first and the stop names that step all the same.
    stop = re.search(r"stopped by SIGTERM (?:while holding at committed|after committing) step (\d+)", log)
    assert stop, log[-4000:]
    held_step = int(stop.group(1))
    assert held_step > notice_step
    commit_line = next(line for line in log.splitlines() if f"checkpoint step {held_step} committed" in line)
    assert "(maintenance-hold)" in commit_line, log[-4000:]
    hold = re.search(rf"^(\S+) .*holding at committed step {held_step}\b", log, re.M)
    if hold:
        assert _stamp(hold.group(0)) < down and _stamp(commit_line) < down
        assert f"stopped by SIGTERM while holding at committed step {held_step}" in log, log
    # 3. After the reboot it resumed exactly there: zero steps recomputed, same weights as no interruption.
    assert f"resume point: step {held_step}" in log
    assert final.extra["weights_sha256"] == digest_of(log)
    reference = run_trainer(trainer_cmd(bucket, "mnt-reference", steps=STEPS, every=STEPS, seed=5))
    assert digest_of(reference.stdout) == digest_of(log)
    # A long-poll cut off by the machine going down is the client vanishing, not an API violation.
    assert [v for v in cloud.violations if "BrokenPipe" not in v] == []
