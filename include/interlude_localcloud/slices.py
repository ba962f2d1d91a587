"""Multi-host TPU slices: the workers (TPU VMs) of one node beyond worker 0, and what each worker knows.

A node of a multi-host accelerator type (v5litepod-16: 4 hosts of 4 chips; v5p-16: 2 hosts; see
`catalog.tpu_shape`) has one TPU VM per host. On Google each VM runs the node's startup-script, has its own
metadata server answering `instance/attributes/agent-worker-number` (0-based) and
`instance/attributes/worker-network-endpoints` (every worker as `unknown:unknown:IP`, in worker order: the
format JAX's `GceTpuCluster` parses, jax/_src/clusters/cloud_tpu_cluster.py), and the node lists one
`networkEndpoints` entry per worker (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes).

Here worker 0 is the `Machine` itself (so a single-host node is exactly what it was); workers 1..N-1 are
`Worker`s with their own process group, disk dir, serial log, maintenance notice and guest attributes. All
run on 127.0.0.1: each worker gets a distinct free port, given to every worker's startup script as
`INTERLUDE_WORKER_PORTS` (p0,p1,...) and `INTERLUDE_COORDINATOR` (127.0.0.1:p0), the local
stand-in for Google's "worker 0's IP, JAX's fixed coordinator port 8482".
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from interlude_localcloud.machines import MachineProcess

if TYPE_CHECKING:
    from interlude_localcloud.cloud import Machine

LOCAL_IP = "127.0.0.1"
TPU_PORT = 8470  # the port Google lists for every TPU worker endpoint


@dataclass
class Worker:
    """Worker `index` (>= 1) of a multi-host node: the guest side of one more TPU VM."""

    index: int
    machine_id: str
    proc: MachineProcess
    port: int
    maintenance: dict[str, Any] | None = None
    maintenance_event: str = "NONE"
    guest_attributes: dict[str, str] = field(default_factory=dict)


def worker_id(machine_id: str, index: int) -> str:
    """Worker 0 keeps the node's machine id; worker i is `<id>.w<i>` (no node or VM name has a dot)."""
    return machine_id if index == 0 else f"{machine_id}.w{index}"


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together so the OS hands out different ones)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOCAL_IP, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def slice_env(ports: list[int]) -> dict[str, str]:
    """What every worker's startup script gets to find its peers locally (not Google's: see the module doc)."""
    return {
        "INTERLUDE_WORKER_PORTS": ",".join(str(p) for p in ports),
        "INTERLUDE_COORDINATOR": f"{LOCAL_IP}:{ports[0]}",
    }


def worker_attributes(m: Machine, index: int) -> dict[str, str]:
    """The TPU-VM attributes Google's metadata server adds to the node's metadata on every worker."""
    endpoints = m.resource.get("networkEndpoints") or []
    return {
        "agent-worker-number": str(index),
        "worker-network-endpoints": ",".join(f"unknown:unknown:{e.get('ipAddress', '')}" for e in endpoints),
    }


def network_endpoints(m: Machine) -> list[dict[str, Any]]:
    """One endpoint per worker, in worker order; `accessConfig.externalIp` only with external IPs enabled
    (networkConfig.enableExternalIps; the address is from the documentation range 203.0.113.0/24)."""
    external = bool((m.resource.get("networkConfig") or {}).get("enableExternalIps"))
    hosts = m.hosts()
    if len(hosts) == 1:
        ips = [f"10.128.0.{2 + int(m.resource['id']) % 250}"]
    else:
        ips = [LOCAL_IP] * len(hosts)
    out: list[dict[str, Any]] = []
    for i, ip in enumerate(ips):
        e: dict[str, Any] = {"ipAddress": ip, "port": TPU_PORT}
        if external:
            e["accessConfig"] = {"externalIp": f"203.0.113.{(int(m.resource['id']) + i) % 250 + 2}"}
        out.append(e)
    return out
