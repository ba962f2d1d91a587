"""How long one cluster-autoscaler planning pass takes as the cluster grows (the local cloud's GKE
controllers run one every few seconds, on the same 2-core machine as everything else).

    .venv/bin/python benchmarks/gke_autoscaler_pass.py [--sizes 10 50 100 200] [--repeat 5]

The cluster is the vLLM TPU/GPU guide's: a TPU v6e pool first, an L4 pool second, activeMigration on;
half the pods are bound to L4 nodes (migration candidates), half are pending.
"""

from __future__ import annotations

import argparse
import time

from interlude_localcloud.gke.policy.autoscaler import ClusterView, plan
from interlude_localcloud.gke.policy.compute_class import ComputeClass
from interlude_localcloud.gke.policy.model import GpuSpec, NodePool, PodView, Toleration, TpuSpec

GIB = 1024.0**3
CLASS = "vllm-fallback"


def cluster(size: int) -> ClusterView:
    storage = {"ephemeral-storage": 47 * GIB, "cpu": 43.0}
    tpu = NodePool(
        "v6e-1", "z", "ct6e-standard-1t", storage, 0, size // 5, True, CLASS, TpuSpec("tpu-v6e-slice", "1x1", 1)
    )
    gpu = NodePool("l4", "z", "g2-standard-4", storage, 0, size * 2, False, CLASS, gpu=GpuSpec("nvidia-l4", 1))
    nodes = [gpu.new_node(f"l4-{i}") for i in range(size)]
    tolerations = (Toleration("google.com/tpu", "Exists"), Toleration("nvidia.com/gpu", "Exists"))

    def pod(name: str, node: str | None) -> PodView:
        selector = {"cloud.google.com/compute-class": CLASS}
        return PodView(name, selector, tolerations, {"ephemeral-storage": 43 * GIB}, node_name=node)

    pods = [pod(f"bound-{i}", f"l4-{i}") for i in range(size)] + [pod(f"pending-{i}", None) for i in range(size)]
    cls = ComputeClass.from_manifest(
        {
            "apiVersion": "cloud.google.com/v1",
            "kind": "ComputeClass",
            "metadata": {"name": CLASS},
            "spec": {
                "priorities": [{"tpu": {"type": "tpu-v6e-slice"}}, {"gpu": {"type": "nvidia-l4"}}],
                "activeMigration": {"optimizeRulePriority": True},
            },
        }
    )
    return ClusterView((tpu, gpu), nodes, pods, {CLASS: cls})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    for size in args.sizes:
        view = cluster(size)
        started = time.perf_counter()
        for _ in range(args.repeat):
            result = plan(view, now=0.0)
        per_pass = (time.perf_counter() - started) / args.repeat
        print(f"{size:4d} nodes, {2 * size:4d} pods: {per_pass * 1000:7.1f} ms/pass, {len(result.actions)} actions")


if __name__ == "__main__":
    main()
