"""Multi-host TPU slices through the real google-cloud-tpu client (and googleapiclient for v2alpha1).

Facts come from outside the API that made them: each worker's own startup-script output (its serial log and
a file it writes), its metadata server's answers, its process (pid, process group), a TCP rendezvous the
workers do over the ports the cloud gave them, and the admin event log.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import tpu_v2
from googleapiclient.discovery import build

from interlude_localcloud.catalog import tpu_shape
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud
from tests.include.interlude_localcloud.conftest import FAST, ZONE, fast_scenario

# Each worker: reads its number and peers from its own metadata server, logs them, writes a guest attribute,
# then worker 0 accepts one connection from every other worker on the coordinator address (what
# jax.distributed's coordinator would do) and logs who joined. Then it idles until SIGTERM.
SCRIPT = r"""#!/bin/bash
md() { curl -sf -H 'Metadata-Flavor: Google' "$INTERLUDE_METADATA_URL/$1"; }
W=$(md instance/attributes/agent-worker-number)
# Boots are kept outside the worker's disk: a slice deleted (a suspended queued resource) takes its disks along.
B="$(md instance/attributes/boots-dir)/$INTERLUDE_MACHINE_ID.txt"
trap 'echo "term $W" >> "$B"; exit 0' TERM
echo "boot $W" >> "$B"
echo "worker=$W endpoints=$(md instance/attributes/worker-network-endpoints)"
echo "coordinator=$INTERLUDE_COORDINATOR ports=$INTERLUDE_WORKER_PORTS"
curl -sf -X PUT --data-binary "up $W" -H 'Metadata-Flavor: Google' \
  "$INTERLUDE_METADATA_URL/instance/guest-attributes/interlude/worker"
python - "$W" <<'PY' &
import os, socket, sys, time
me = int(sys.argv[1])
host, port = os.environ["INTERLUDE_COORDINATOR"].split(":")
peers = len(os.environ["INTERLUDE_WORKER_PORTS"].split(",")) - 1
if me == 0:
    srv = socket.create_server((host, int(port)))
    srv.settimeout(30)
    got = sorted(srv.accept()[0].recv(16).decode() for _ in range(peers))
    print("rendezvous " + ",".join(got), flush=True)
else:
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection((host, int(port)), timeout=2).sendall(str(me).encode())
            break
        except OSError:
            time.sleep(0.1)
PY
while true; do sleep 0.1; done
"""

SCENARIO = {
    **FAST,
    "zones": {
        ZONE: {
            "region": "us-central1",
            "tpu": {
                "accelerator_types": ["v5litepod-16", "v6e-16", "v5p-16", "v6e-8"],
                "runtime_versions": ["v2-alpha-tpuv5-lite", "v2-alpha-tpuv6e", "v2-alpha-tpuv5"],
                "capacity": {
                    "v5litepod-16": {"on_demand": 2, "spot": 0},
                    "v6e-16": {"on_demand": 0, "spot": 1},
                    "v5p-16": 2,
                },
                "quota": {"v5p": 8},  # chips: one v5p-16 (16 TensorCores, 8 chips) fits, two do not
            },
        },
    },
    "regions": {},
    # Scheduled notices 10 s (performMaintenance starts them); windows last 1 s: long enough to see, short to wait.
    "maintenance": {
        "tpu": {"scheduled_notice": 36000, "unscheduled_notice": 0, "duration": 3600},
        "gce": FAST["maintenance"]["gce"],
    },
}


def until(pred: Callable[[], Any], timeout: float = 90.0, what: str = "") -> Any:
    """Poll until ``pred`` holds; the bound is for a machine under a full suite's load, not a target."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what or pred}")


@pytest.fixture(scope="module")
def lc() -> Iterator[RunningLocalCloud]:
    with running_localcloud(fast_scenario(**SCENARIO), gcs=False, strict=True) as cloud:
        BOOTS[:] = [boots_dir(cloud)]
        yield cloud
        assert cloud.violations == []


@pytest.fixture(scope="module")
def tpu(lc: RunningLocalCloud) -> tpu_v2.TpuClient:
    return tpu_v2.TpuClient(
        transport="rest", client_options={"api_endpoint": lc.api_endpoint}, credentials=AnonymousCredentials()
    )


def parent(lc: RunningLocalCloud) -> str:
    return f"projects/{lc.project}/locations/{ZONE}"


def workers(lc: RunningLocalCloud, name: str) -> list[dict[str, Any]]:
    m = lc.admin.machine("tpu", ZONE, name)
    assert m is not None, name
    return list(m["workers"])


def boots_dir(lc: RunningLocalCloud) -> Path:
    path = Path(lc.state_dir) / "boots"
    path.mkdir(exist_ok=True)
    return path


def boots(w: dict[str, Any]) -> list[str]:
    p = BOOTS[0] / f"{w['id']}.txt"
    return p.read_text().splitlines() if p.exists() else []


BOOTS: list[Path] = []  # the module's boots dir (set by the lc fixture)


def serial(w: dict[str, Any]) -> str:
    p = Path(w["disk_dir"]) / "serial.log"
    return p.read_text() if p.exists() else ""


def metadata(lc: RunningLocalCloud, worker: dict[str, Any], key: str) -> str:
    url = f"{lc.api_endpoint}/_machines/{worker['id']}/computeMetadata/v1/{key}"
    r = requests.get(url, headers={"Metadata-Flavor": "Google"}, timeout=10)
    r.raise_for_status()
    return r.text


def raw_node(lc: RunningLocalCloud, name: str) -> dict[str, Any]:
    return requests.get(f"{lc.api_endpoint}/v2/{parent(lc)}/nodes/{name}", timeout=5).json()


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # an exited process its parent has not reaped yet is gone


def settled(lc: RunningLocalCloud, name: str) -> list[dict[str, Any]] | None:
    """The workers, once each one's own record ends in a boot (no restart half done)."""
    ws = workers(lc, name)
    return ws if all(boots(w)[-1:] == [f"boot {w['worker']}"] for w in ws) else None


def all_up(lc: RunningLocalCloud, name: str, boot_count: int) -> bool:
    ws = workers(lc, name)
    return all(boots(w).count(f"boot {w['worker']}") == boot_count and alive(w["pid"]) for w in ws)


@pytest.fixture(scope="module")
def slice16(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> tpu_v2.Node:
    """One v5litepod-16 (4 workers of 4 chips) with every worker up and the rendezvous done."""
    node = tpu_v2.Node(
        accelerator_type="v5litepod-16",
        runtime_version="v2-alpha-tpuv5-lite",
        metadata={"startup-script": SCRIPT, "boots-dir": str(BOOTS[0])},
    )
    got = tpu.create_node(parent=parent(lc), node_id="slice", node=node).result(timeout=20)
    until(lambda: all_up(lc, "slice", 1), what="every worker's first boot")
    until(lambda: "rendezvous" in serial(workers(lc, "slice")[0]), what="the workers' rendezvous")
    return got


@pytest.mark.parametrize(
    ("accel", "chips", "hosts", "topology"),
    [
        ("v5litepod-8", 8, 1, "2x4"),
        ("v5litepod-16", 16, 4, "4x4"),
        ("v6e-16", 16, 4, "4x4"),
        ("v6e-256", 256, 64, "16x16"),
        ("v5p-8", 4, 1, "2x2x1"),
        ("v5p-16", 8, 2, "2x2x2"),
        ("v4-32", 16, 4, "2x2x4"),
    ],
)
def test_shapes_from_googles_tables(accel: str, chips: int, hosts: int, topology: str) -> None:
    shape = tpu_shape(accel)
    assert (shape.chips, shape.hosts, shape.topology) == (chips, hosts, topology)


def test_every_worker_runs_with_its_own_number_peers_and_port(lc: RunningLocalCloud, slice16: tpu_v2.Node) -> None:
    assert [(e.ip_address, e.port) for e in slice16.network_endpoints] == [("127.0.0.1", 8470)] * 4
    assert slice16.accelerator_config.topology == "4x4"
    ws = workers(lc, "slice")
    assert [w["worker"] for w in ws] == [0, 1, 2, 3]
    # Four process groups of their own (what a per-VM shutdown signals), four disks.
    pids = [w["pid"] for w in ws]
    assert len(set(pids)) == 4 and all(os.getpgid(p) == p for p in pids)
    assert len({w["disk_dir"] for w in ws}) == 4
    ports: set[str] = set()
    for w in ws:
        log = serial(w)
        # The worker's own metadata server told it its number and every peer, in Google's format.
        assert f"worker={w['worker']} endpoints=" + ",".join(["unknown:unknown:127.0.0.1"] * 4) in log
        m = re.search(r"coordinator=(\S+) ports=(\S+)", log)
        assert m is not None
        ports.add(m[2])
        assert m[1] == f"127.0.0.1:{m[2].split(',')[0]}"
        assert metadata(lc, w, "instance/attributes/agent-worker-number") == str(w["worker"])
        assert "startup-script" in metadata(lc, w, "instance/attributes/")
    assert len(ports) == 1 and len(set(ports.pop().split(","))) == 4  # one list, four distinct ports
    assert "rendezvous 1,2,3" in serial(ws[0])  # the others reached worker 0 at the coordinator address


def test_guest_attributes_per_worker(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient, slice16: tpu_v2.Node) -> None:
    def read(**req: Any) -> list[list[str]]:
        out = tpu.get_guest_attributes(request={"name": slice16.name, "query_path": "interlude/", **req})
        return [[e.value for e in a.query_value.items] for a in out.guest_attributes]

    until(lambda: read() == [["up 0"], ["up 1"], ["up 2"], ["up 3"]], what="every worker's guest attribute")
    assert read(worker_ids=["2"]) == [["up 2"]]
    assert read(worker_ids=["3", "1"]) == [["up 3"], ["up 1"]]
    with pytest.raises(exceptions.BadRequest):
        read(worker_ids=["4"])


def test_a_crashed_worker_interrupts_the_whole_slice(lc: RunningLocalCloud, slice16: tpu_v2.Node) -> None:
    """https://cloud.google.com/tpu/docs/failure-recovery: a slice's instances are recovered together."""
    before = until(lambda: settled(lc, "slice"), what="no restart half done")
    first = [boots(w).count(f"boot {w['worker']}") for w in before]
    since = time.time()
    lc.admin.crash("tpu", ZONE, "slice", worker=1)
    assert raw_node(lc, "slice")["state"] == "REPAIRING"
    # Worker 1 was killed (no SIGTERM line of its own); every other worker got its SIGTERM and stopped.
    until(lambda: all(not alive(w["pid"]) for w in before), what="every old worker process gone")
    assert [f"term {w['worker']}" in boots(w)[-1:] for w in before] == [True, False, True, True]
    until(lambda: raw_node(lc, "slice")["state"] == "READY", what="the slice recovered")
    until(
        lambda: all(boots(w).count(f"boot {w['worker']}") == first[i] + 1 for i, w in enumerate(before)),
        what="every worker booted again",
    )
    assert all(alive(w["pid"]) for w in workers(lc, "slice"))
    events = lc.admin.events(since)
    assert [(e["machine"], e["worker"]) for e in events if e["event"] == "machine_crash"] == [(before[1]["id"], 1)]
    stopped = [e["worker"] for e in events if e["event"] == "machine_down" and e["reason"] == "slice_recovery"]
    assert sorted(stopped) == [0, 2, 3]
    assert [e["machine"] for e in events if e["event"] == "slice_recovered"] == [
        lc.admin.machine("tpu", ZONE, "slice")["id"]
    ]


def v2alpha1(lc: RunningLocalCloud) -> Any:
    return build(
        "tpu",
        "v2alpha1",
        credentials=AnonymousCredentials(),
        static_discovery=True,
        client_options={"api_endpoint": lc.api_endpoint},
    )


def test_one_workers_maintenance_stops_and_restarts_the_slice(lc: RunningLocalCloud, slice16: tpu_v2.Node) -> None:
    api = v2alpha1(lc).projects().locations().nodes()
    ws = until(lambda: settled(lc, "slice"), what="no restart half done")  # the crash test's reboot, say
    terms = [boots(w).count(f"term {w['worker']}") for w in ws]
    lc.admin.next_maintenance("SCHEDULED", notice_seconds=360000, kind="tpu")  # 100 s: performMaintenance starts it
    since = time.time()
    api.simulateMaintenanceEvent(name=slice16.name, body={"workerIds": ["2"]}).execute()
    node = raw_node(lc, "slice")
    assert node["upcomingMaintenance"]["maintenanceStatus"] == "PENDING"
    assert node["upcomingMaintenance"]["canReschedule"] is True  # v5e from 2x4 up
    # Only worker 2's metadata server has the notice.
    assert metadata(lc, ws[2], "instance/maintenance-event") == "TERMINATE_ON_HOST_MAINTENANCE"
    assert json.loads(metadata(lc, ws[2], "instance/upcoming-maintenance"))["maintenance_status"] == "PENDING"
    assert [metadata(lc, ws[i], "instance/maintenance-event") for i in (0, 1, 3)] == ["NONE"] * 3
    assert json.loads(metadata(lc, ws[0], "instance/upcoming-maintenance")) == {}

    api.performMaintenance(name=slice16.name, body={}).execute()
    node = raw_node(lc, "slice")
    assert (node["state"], node["health"]) == ("REPAIRING", "UNHEALTHY_MAINTENANCE")
    # Every worker's script got SIGTERM (its own record), not only worker 2's.
    until(lambda: all(boots(w).count(f"term {w['worker']}") == terms[i] + 1 for i, w in enumerate(ws)), what="terms")
    # A worker that wrote its SIGTERM line may still be exiting: its end is awaited, not assumed.
    until(lambda: all(not alive(w["pid"]) for w in ws), what="every old worker process gone")
    until(lambda: raw_node(lc, "slice")["state"] == "READY", what="the slice back")
    until(lambda: all(alive(w["pid"]) for w in workers(lc, "slice")), what="every worker rebooted")
    assert "upcomingMaintenance" not in raw_node(lc, "slice")
    assert metadata(lc, ws[2], "instance/maintenance-event") == "NONE"
    events = lc.admin.events(since)
    assert [(e["machine"], e["worker"]) for e in events if e["event"] == "maintenance_notice"] == [(ws[2]["id"], 2)]
    assert [e.get("worker") for e in events if e["event"] == "maintenance_start"] == [2]
    downs = {e["machine"] for e in events if e["event"] == "machine_down" and e["reason"] == "maintenance"}
    assert downs == {w["id"] for w in ws}


def test_a_window_opening_on_one_worker_interrupts_the_slice(lc: RunningLocalCloud, slice16: tpu_v2.Node) -> None:
    ws = until(lambda: settled(lc, "slice"), what="no restart half done")
    before = [len(boots(w)) for w in ws]
    since = time.time()
    lc.admin.maintenance("tpu", ZONE, "slice", type="UNSCHEDULED", notice_seconds=1800, worker=3)  # opens in 0.5 s
    until(lambda: raw_node(lc, "slice")["state"] == "REPAIRING", what="the window opening")
    until(lambda: raw_node(lc, "slice")["state"] == "READY", what="the slice back")
    # Each worker logged a SIGTERM and a boot of its own.
    pairs = list(zip(ws, before, strict=True))
    until(
        lambda: all(boots(w)[n:] == [f"term {w['worker']}", f"boot {w['worker']}"] for w, n in pairs),
        what="a term and a boot per worker",
    )
    assert all(alive(w["pid"]) for w in workers(lc, "slice"))
    assert [e.get("worker") for e in lc.admin.events(since) if e["event"] == "maintenance_start"] == [3]


def test_a_held_window_on_one_worker_opens_for_the_whole_slice_when_the_test_says(
    lc: RunningLocalCloud, slice16: tpu_v2.Node
) -> None:
    """A worker's held notice: past its windowStartTime the slice stays READY; the test opens it (admin
    open-window for that worker) and the whole slice goes down, the cloud saying what opened it."""
    ws = until(lambda: settled(lc, "slice"), what="no restart half done")
    since = time.time()
    lc.admin.maintenance("tpu", ZONE, "slice", "SCHEDULED", 1800, worker=1, held=True, latest_start_after=3600 * 50)
    up = raw_node(lc, "slice")["upcomingMaintenance"]
    assert up["maintenanceStatus"] == "PENDING" and up["windowStartTime"] < up["latestWindowStartTime"]
    start = datetime.fromisoformat(up["windowStartTime"].replace("Z", "+00:00")).timestamp()
    until(lambda: time.time() > start + 0.5, what="past windowStartTime")
    assert raw_node(lc, "slice")["state"] == "READY"
    assert not [e for e in lc.admin.events(since) if e["event"] == "maintenance_start"]
    lc.admin.open_window("tpu", ZONE, "slice", worker=1)
    until(lambda: raw_node(lc, "slice")["state"] == "REPAIRING", what="the window opening")
    until(lambda: raw_node(lc, "slice")["state"] == "READY", what="the slice back")
    started = [e for e in lc.admin.events(since) if e["event"] == "maintenance_start"]
    assert [(e.get("worker"), e["cause"]) for e in started] == [(1, "released")], started
    downs = {e["machine"] for e in lc.admin.events(since) if e["event"] == "machine_down"}
    assert downs == {w["id"] for w in ws}


def test_queued_resource_slice_and_preemption_of_one_worker(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    node = tpu_v2.Node(
        accelerator_type="v6e-16",
        runtime_version="v2-alpha-tpuv6e",
        metadata={"startup-script": SCRIPT, "boots-dir": str(BOOTS[0])},
    )
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent(lc), node_id="qslice", node=node)]
        ),
        spot=tpu_v2.QueuedResource.Spot(),
    )
    tpu.create_queued_resource(parent=parent(lc), queued_resource_id="q16", queued_resource=qr).result(timeout=20)
    qname = f"{parent(lc)}/queuedResources/q16"
    until(lambda: tpu.get_queued_resource(name=qname).state.state == tpu_v2.QueuedResourceState.State.ACTIVE)
    got = tpu.get_node(name=f"{parent(lc)}/nodes/qslice")
    assert len(got.network_endpoints) == 4 and got.queued_resource == qname
    until(lambda: all_up(lc, "qslice", 1), what="four workers up")
    ws = workers(lc, "qslice")
    since = time.time()
    lc.admin.preempt("tpu", ZONE, "qslice", worker=3)
    # PREEMPTED, or already deleted: a suspended Spot queued resource's slice goes (a GET under load can come after)
    seen = raw_node(lc, "qslice")
    assert seen.get("state") == "PREEMPTED" or (seen.get("error") or {}).get("code") == 404, seen
    until(lambda: not any(alive(w["pid"]) for w in ws), what="every worker's process gone")
    assert all(boots(w)[-1] == f"term {w['worker']}" for w in ws)
    events = lc.admin.events(since)
    assert [(e["event"], e.get("worker")) for e in events if "preempted" in e["event"]] == [
        ("worker_preempted", 3),
        ("preempted", None),
    ]
    until(lambda: tpu.get_queued_resource(name=qname).state.state == tpu_v2.QueuedResourceState.State.SUSPENDED)
    tpu.delete_queued_resource(request={"name": qname, "force": True}).result(timeout=20)


def test_quota_counts_chips_and_types_show_their_topology(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    topologies = {a.type_: a.accelerator_configs[0].topology for a in tpu.list_accelerator_types(parent=parent(lc))}
    assert topologies["v5litepod-16"] == "4x4" and topologies["v5p-16"] == "2x2x2"
    node = tpu_v2.Node(accelerator_type="v5p-16", runtime_version="v2-alpha-tpuv5")
    first = tpu.create_node(parent=parent(lc), node_id="p1", node=node).result(timeout=20)  # 8 chips of 8
    assert len(first.network_endpoints) == 2
    disks = [Path(w["disk_dir"]) for w in workers(lc, "p1")]
    assert [w["worker"] for w in workers(lc, "p1")] == [0, 1] and all(d.is_dir() for d in disks)
    with pytest.raises(exceptions.GoogleAPICallError, match="Quota limit"):  # 16 chips > 8; capacity has room
        tpu.create_node(parent=parent(lc), node_id="p2", node=node).result(timeout=20)
    tpu.delete_node(name=first.name).result(timeout=20)
    until(lambda: not any(d.exists() for d in disks), what="every worker's disk removed with the node")
