"""A real `python -m interlude_localcloud` process with a GKE scenario: every socket it listens on is
bound to 127.0.0.1 (API server, Kubernetes API servers, GCS emulator child), and the connection
extras the dev helpers write reach GKE."""

from __future__ import annotations

from pathlib import Path

import psutil
import yaml
from google.auth.credentials import AnonymousCredentials
from google.cloud import container_v1

from interlude_dev.wiring import connection_extra, start_localcloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, GKE_SCENARIO, LOCATION


def _listening(pid: int) -> list[tuple[str, int]]:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    out = []
    for p in procs:
        for c in p.net_connections(kind="inet"):
            if c.status == psutil.CONN_LISTEN:
                out.append((c.laddr.ip, c.laddr.port))
    return out


def test_every_listening_socket_is_loopback(tmp_path: Path) -> None:
    scenario = tmp_path / "gke.yaml"
    scenario.write_text(yaml.safe_dump(GKE_SCENARIO))
    cloud = start_localcloud(scenario, tmp_path / "state")
    try:
        extra = connection_extra(cloud.project, cloud.api_endpoint, cloud.container_endpoint)
        assert extra["container_endpoint"] == cloud.api_endpoint
        cm = container_v1.ClusterManagerClient(
            transport="rest",
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": extra["container_endpoint"]},
        )
        cluster = cm.get_cluster(name=f"projects/{GKE_SCENARIO['project']}/locations/{LOCATION}/clusters/{CLUSTER}")
        kube_port = int(cluster.endpoint.split(":")[1])
        sockets = _listening(cloud.process.pid)
        ports = {port for _, port in sockets}
        assert int(cloud.api_endpoint.rsplit(":", 1)[1]) in ports and kube_port in ports
        assert {ip for ip, _ in sockets} == {"127.0.0.1"}, sockets
    finally:
        cloud.stop()
