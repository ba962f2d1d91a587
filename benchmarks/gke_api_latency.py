"""Round-trip latency of the local GKE Kubernetes API through the real `kubernetes` client.

Why: pipelines will poll Deployments and watch pods through this server; its per-request cost (TLS,
FastAPI, admission with kubernetes-validate) bounds how fast a test can drive it.
Run: `.venv/bin/python benchmarks/gke_api_latency.py` (prints ms per GET and per validated create).
"""

from __future__ import annotations

import tempfile
import time

from kubernetes import client

from interlude_localcloud.testing import running_localcloud


def main(gets: int = 200, creates: int = 50) -> None:
    with running_localcloud("gke_serving", gcs=False, strict=True) as lc:
        cluster = next(iter(lc.cloud_gke().clusters.values()))
        with tempfile.NamedTemporaryFile(suffix=".pem") as ca:
            ca.write(cluster.kube.tls.ca_pem)
            ca.flush()
            cfg = client.Configuration(
                host=f"https://{cluster.kube.endpoint}",
                api_key={"BearerToken": "bench"},
                api_key_prefix={"BearerToken": "Bearer"},
            )
            cfg.ssl_ca_cert = ca.name
            core = client.CoreV1Api(client.ApiClient(cfg))
            start = time.perf_counter()
            for _ in range(gets):
                core.read_namespace("default")
            get_ms = (time.perf_counter() - start) / gets * 1000
            start = time.perf_counter()
            for i in range(creates):
                core.create_namespaced_service(
                    "default",
                    client.V1Service(
                        metadata=client.V1ObjectMeta(name=f"s{i}"),
                        spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=80)]),
                    ),
                )
            create_ms = (time.perf_counter() - start) / creates * 1000
        print(
            f"GET namespace: {get_ms:.1f} ms/request; create Service (validated): {create_ms:.1f} ms/request; "
            f"strict violations: {len(lc.violations)}"
        )


if __name__ == "__main__":
    main()
