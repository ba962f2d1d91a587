"""The rendered manifests meet the local cloud's GKE (interlude_localcloud.gke.policy): the ComputeClass
parses and ranks a TPU pool before an L4 pool (and the reverse after a fallback), and the two-container
pod fits a TPU node and an L4 node alike - the independent model that will schedule it in the e2e runs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from interlude.serving import render
from interlude.serving.spec import ServeSpec
from interlude.serving.tables import load_table
from interlude_localcloud.gke.policy.compute_class import ComputeClass
from interlude_localcloud.gke.policy.manifests import pod_from_manifest
from interlude_localcloud.gke.policy.model import GpuSpec, NodePool, TpuSpec
from interlude_localcloud.gke.policy.scheduling import check, schedule, usage_by_node

GIB = 2.0**30
CKPT = "gs://interlude-local/interlude/run-1/finetune/step-00000030/"


def _pools(spec: ServeSpec) -> tuple[NodePool, NodePool]:
    shape = load_table().tpu_shapes[spec.tpu_type]
    tpu = NodePool(
        "tpu",
        "us-central2-b",
        shape.machine_type,
        {"cpu": 43.0, "memory": 170 * GIB, "pods": 110},
        compute_class=spec.name,
        tpu=TpuSpec(shape.gke_accelerator, shape.topology, shape.chips),
    )
    # g2-standard-4: the smallest L4 machine (4 vCPU, 16 GB; ~3.9 CPU / ~13 GiB allocatable)
    gpu = NodePool(
        "l4",
        "us-central2-b",
        "g2-standard-4",
        {"cpu": 3.92, "memory": 13 * GIB, "pods": 110},
        compute_class=spec.name,
        gpu=GpuSpec(spec.gpu_type, spec.gpu_count, spec.gpu_driver_version),
    )
    return tpu, gpu


def _pod(spec: ServeSpec) -> dict[str, Any]:
    template = render.deployment(spec)["spec"]["template"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p-1", **template["metadata"]},
        "spec": template["spec"],
    }


@pytest.mark.parametrize("tpu_type", ["v6e-1", "v6e-8", "v5litepod-4", "v5p-8"])
def test_the_class_ranks_tpu_first_then_gpu_and_reverses_on_fallback(tpu_type: str) -> None:
    spec = ServeSpec(checkpoint_uri=CKPT, tpu_type=tpu_type)
    tpu, gpu = _pools(spec)
    tpu_first = ComputeClass.from_manifest(render.compute_class(spec, "tpu_first"))
    gpu_first = ComputeClass.from_manifest(render.compute_class(spec, "gpu_first"))
    assert (tpu_first.rank(tpu), tpu_first.rank(gpu)) == (0, 1)
    assert (gpu_first.rank(tpu), gpu_first.rank(gpu)) == (1, 0)
    assert tpu_first.optimize_rule_priority and not gpu_first.optimize_rule_priority


def test_the_pod_fits_a_tpu_node_and_an_l4_node() -> None:
    spec = ServeSpec(checkpoint_uri=CKPT)
    pod = pod_from_manifest(_pod(spec))
    for pool in _pools(spec):
        fit = check(pod, pool.new_node(f"{pool.name}-1"), {})
        assert fit.fits, (pool.name, fit.reason)


def test_the_pod_stays_off_nodes_outside_its_class() -> None:
    spec = ServeSpec(checkpoint_uri=CKPT)
    pod = pod_from_manifest(_pod(spec))
    stranger = NodePool(
        "other",
        "us-central2-b",
        "g2-standard-4",
        {"cpu": 3.92, "memory": 13 * GIB, "pods": 110},
        gpu=GpuSpec("nvidia-l4", 1),
    )
    assert not check(pod, stranger.new_node("other-1"), {}).fits


def _with_accelerator_requests(pod: dict[str, Any], chips: int, gpus: int) -> dict[str, Any]:
    """The pod with `google.com/tpu` on the TPU container and `nvidia.com/gpu` on the GPU container."""
    wanted = {"vllm-tpu": {"google.com/tpu": str(chips)}, "vllm-gpu": {"nvidia.com/gpu": str(gpus)}}
    containers = []
    for c in pod["spec"]["containers"]:
        extra = wanted.get(c["name"], {})
        limits = {**(c.get("resources") or {}).get("limits", {}), **extra}
        containers.append({**c, "resources": {**c.get("resources", {}), "limits": limits}})
    return {**pod, "spec": {**pod["spec"], "containers": containers}}


def test_per_container_accelerator_requests_would_fit_no_node() -> None:
    """Why the Deployment requests no accelerator: a pod's requests are the sum over its containers, so a TPU
    request in one container and a GPU request in the other need a node with both - which GKE has nowhere
    (https://kubernetes.io/docs/concepts/configuration/manage-resources-containers/#requests-and-limits).
    The local scheduler honours extended resources as kube-scheduler does, so it says so."""
    spec = ServeSpec(checkpoint_uri=CKPT)
    chips = load_table().tpu_shapes[spec.tpu_type].chips
    pod = pod_from_manifest(_with_accelerator_requests(_pod(spec), chips, spec.gpu_count))
    assert pod.requests["google.com/tpu"] == chips and pod.requests["nvidia.com/gpu"] == spec.gpu_count
    tpu, gpu = _pools(spec)
    on_tpu, on_gpu = check(pod, tpu.new_node("tpu-1"), {}), check(pod, gpu.new_node("l4-1"), {})
    assert (on_tpu.fits, on_tpu.reason) == (False, "Insufficient nvidia.com/gpu")
    assert (on_gpu.fits, on_gpu.reason) == (False, "Insufficient google.com/tpu")
    # one kind alone pins the pod to that kind: the fallback could never move it
    tpu_only = pod_from_manifest(_with_accelerator_requests(_pod(spec), chips, 0))
    assert check(tpu_only, tpu.new_node("tpu-1"), {}).fits
    assert not check(tpu_only, gpu.new_node("l4-1"), {}).fits


def test_a_second_replica_never_joins_a_node_holding_one() -> None:
    """The rendered pod's required anti-affinity on kubernetes.io/hostname: a TPU node with room for 21 replicas
    by CPU still takes one (a second vLLM could not open its chips), so the next replica needs another node -
    an L4 one when the TPU pool is at its limit. Other workloads' pods do not count."""
    spec = ServeSpec(checkpoint_uri=CKPT)
    first = pod_from_manifest(_pod(spec))
    second = pod_from_manifest({**_pod(spec), "metadata": {**_pod(spec)["metadata"], "name": "p-2"}})
    tpu, gpu = _pools(spec)
    node = tpu.new_node("tpu-1")
    holding_one = usage_by_node([replace(first, node_name="tpu-1")])["tpu-1"]
    assert (check(second, node, holding_one).fits, check(second, node, holding_one).reason) == (
        False,
        "node(s) didn't match pod anti-affinity rules",
    )
    assert check(second, gpu.new_node("l4-1"), usage_by_node([replace(first, node_name="tpu-1")]).get("l4-1", {})).fits
    other = replace(first, labels={"app.kubernetes.io/name": "something-else"}, anti_affinity=(), node_name="tpu-1")
    assert check(second, node, usage_by_node([other])["tpu-1"]).fits
    placed = schedule([first, second], [node, gpu.new_node("l4-1")], [])
    assert sorted(p.node or "" for p in placed) == ["l4-1", "tpu-1"], placed
