"""Node objects for node pools' current sizes, labelled and tainted the way GKE does it.

Labels: cloud.google.com/gke-nodepool, cloud.google.com/machine-family, cloud.google.com/gke-spot,
cloud.google.com/gke-tpu-accelerator + gke-tpu-topology (TPU), cloud.google.com/gke-accelerator (GPU),
cloud.google.com/compute-class (pools a ComputeClass names, with its taint); taints google.com/tpu=present:NoSchedule,
nvidia.com/gpu=present:NoSchedule and cloud.google.com/compute-class=NAME:NoSchedule
(https://cloud.google.com/kubernetes-engine/docs/how-to/tpus,
https://cloud.google.com/kubernetes-engine/docs/how-to/gpus,
https://cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes).
"""

from __future__ import annotations

import hashlib
from typing import Any

from interlude_localcloud.gke.config import NodePoolSpec
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.store import Store

NODES = next(r for r in RESOURCES if r.plural == "nodes")
POOL_LABEL = "cloud.google.com/gke-nodepool"


def node_name(cluster: str, pool: str, index: int) -> str:
    digest = hashlib.sha256(f"{cluster}/{pool}".encode()).hexdigest()[:8]
    return f"gke-{cluster}-{pool}-{digest}-{index:04x}"[:63]


def _labels(pool: NodePoolSpec, zone: str, name: str) -> dict[str, str]:
    labels = {
        POOL_LABEL: pool.name,
        "cloud.google.com/machine-family": pool.machine_type.split("-")[0],
        "node.kubernetes.io/instance-type": pool.machine_type,
        "topology.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": zone.rsplit("-", 1)[0],
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **pool.labels,
    }
    if pool.spot:
        labels["cloud.google.com/gke-spot"] = "true"
        labels["cloud.google.com/gke-provisioning"] = "spot"
    if pool.tpu:
        labels["cloud.google.com/gke-tpu-accelerator"] = pool.tpu.accelerator
        labels["cloud.google.com/gke-tpu-topology"] = pool.tpu.topology
    if pool.gpu:
        labels["cloud.google.com/gke-accelerator"] = pool.gpu.type
        labels["cloud.google.com/gke-accelerator-count"] = str(pool.gpu.count)
    return labels


def _taints(pool: NodePoolSpec) -> list[dict[str, str]]:
    taints = [{"key": t.key, "value": t.value, "effect": t.effect} for t in pool.taints]
    if pool.tpu:
        taints.append({"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"})
    if pool.gpu:
        taints.append({"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"})
    return taints


def node_object(cluster: str, pool: NodePoolSpec, index: int, version: str) -> dict[str, Any]:
    name = node_name(cluster, pool.name, index)
    zone = pool.zones[index % len(pool.zones)]
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    if pool.tpu:
        capacity["google.com/tpu"] = str(pool.tpu.chips)
    if pool.gpu:
        capacity["nvidia.com/gpu"] = str(pool.gpu.count)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": _labels(pool, zone, name)},
        "spec": {"taints": _taints(pool), "providerID": f"gce://localcloud/{zone}/{name}"},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                }
            ],
            "nodeInfo": {
                "kubeletVersion": f"v{version}",
                "containerRuntimeVersion": "containerd://1.7.24",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "osImage": "Container-Optimized OS",
                "kernelVersion": "6.6.0",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": f"v{version}",
            },
        },
    }


def sync_pool(store: Store, cluster: str, pool: NodePoolSpec, size: int, version: str) -> None:
    """Make the pool's Node objects exactly indexes 0..size-1 (scale up adds, scale down removes the last)."""
    existing, _ = store.list(NODES, None, lambda o: o["metadata"]["labels"].get(POOL_LABEL) == pool.name)
    want = {node_name(cluster, pool.name, i): i for i in range(size)}
    for obj in existing:
        if obj["metadata"]["name"] not in want:
            store.delete(NODES, "", obj["metadata"]["name"])
    have = {o["metadata"]["name"] for o in existing}
    for name, i in want.items():
        if name not in have:
            store.create(NODES, "", node_object(cluster, pool, i, version))
