"""The runtime's pieces that need no cluster: path/port rewriting, Prometheus parsing, the Service proxy."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
import requests

from interlude_localcloud.gke.containers import image_commands, node_host, rewrite_paths, rewrite_ports
from interlude_localcloud.gke.hpa_controller import metric_of, series_sum
from interlude_localcloud.gke.proxy import ServiceProxy


def test_mount_paths_are_rewritten_only_at_path_starts() -> None:
    mounts = {"/run/interlude/node": "/s/node-facts", "/var/run/interlude/kube-api": "/s/kube-api"}
    text = "open('/var/run/interlude/kube-api/token'); out = '/run/interlude/node/tpu.env'"
    assert rewrite_paths(text, mounts) == "open('/s/kube-api/token'); out = '/s/node-facts/tpu.env'"
    assert rewrite_paths(". /run/interlude/node/tpu.env && x", mounts) == ". /s/node-facts/tpu.env && x"
    assert rewrite_paths("/run/interlude/nodes", mounts) == "/run/interlude/nodes"


def test_declared_container_ports_move_to_the_pods_loopback_port() -> None:
    argv = ["vllm", "serve", "--port=8000", "--port", "8000", "--port=9000", "--max-model-len=8000"]
    assert rewrite_ports(argv, {8000: 41234}) == [
        "vllm",
        "serve",
        "--port=41234",
        "--port",
        "41234",
        "--port=9000",
        "--max-model-len=8000",
    ]


def test_image_globs_pick_local_commands() -> None:
    images = {"*vllm/vllm-tpu:*": {"vllm": ["{python}", "{repo}/include/serving/vllm_standin.py"]}}
    cmds = image_commands(images, "docker.io/vllm/vllm-tpu:v0.11.1")
    assert cmds["vllm"][1].endswith("include/serving/vllm_standin.py")
    assert image_commands(images, "docker.io/vllm/vllm-openai:v0.11.0") == {}


def test_node_roots_show_the_accelerator_as_the_entrypoints_look_for_it(tmp_path) -> None:
    tpu = node_host(tmp_path, "tpu-node", {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"})
    gpu = node_host(tmp_path, "gpu-node", {"cloud.google.com/gke-accelerator": "nvidia-l4"})
    assert (tpu.root / "dev" / "vfio" / "0").exists() and tpu.path == ()
    assert not (gpu.root / "dev" / "vfio" / "0").exists()
    assert len(gpu.path) == 1 and (tmp_path / "gpu-node" / gpu.path[0] / "nvidia-smi").exists()


def test_prometheus_series_are_summed_and_adapter_names_mapped() -> None:
    text = (
        '# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting{model_name="a"} 2.0\n'
        'vllm:num_requests_waiting{model_name="b"} 1\nvllm:num_requests_waiting_total 9\n'
    )
    assert series_sum(text, "vllm:num_requests_waiting") == 3.0
    assert series_sum(text, "vllm:num_requests_running") is None
    spec = {
        "metrics": [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"},
                    "target": {"type": "AverageValue", "averageValue": "500m"},
                },
            }
        ]
    }
    metric = metric_of(spec)
    assert metric is not None and (metric.series, metric.target) == ("vllm:num_requests_waiting", 0.5)


def _server(tag: str) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = tag.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture
def backends() -> Iterator[list[http.server.ThreadingHTTPServer]]:
    servers = [_server("a"), _server("b")]
    yield servers
    for s in servers:
        s.shutdown()
        s.server_close()


def test_service_proxy_round_robins_over_ready_endpoints(backends: list[http.server.ThreadingHTTPServer]) -> None:
    proxy = ServiceProxy("svc")
    try:
        url = f"http://127.0.0.1:{proxy.port}/"
        with pytest.raises(requests.ConnectionError):  # no ready endpoint: refused
            requests.get(url, timeout=5)
        proxy.set_backends([s.server_address[1] for s in backends])
        answers = [requests.get(url, timeout=5).text for _ in range(6)]
        assert sorted(answers) == ["a", "a", "a", "b", "b", "b"]
        proxy.set_backends([backends[1].server_address[1]])
        assert {requests.get(url, timeout=5).text for _ in range(3)} == {"b"}
    finally:
        proxy.close()
