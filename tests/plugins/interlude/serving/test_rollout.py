"""The rollout / delete / smoke decisions over Kubernetes JSON, from tables (no cluster, no Airflow)."""

from __future__ import annotations

from typing import Any

import pytest

from interlude.serving.rollout import leftovers, placements, rollout_state, smoke_problems

NODES = {
    "tpu-node": {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"},
    "l4-node": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
    "cpu-node": {},
}
CKPT = "gs://b/interlude/run/finetune/step-00000005/"


def pod(name: str, node: str | None, ready: bool, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
    cond = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": "2026-12-02T10:00:00Z"}
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": {"conditions": [cond]}}


def deployment(generation: int = 2, observed: int = 2, want: int = 2, **status: int) -> dict[str, Any]:
    full = {"replicas": want, "updatedReplicas": want, "availableReplicas": want, **status}
    return {
        "metadata": {"generation": generation},
        "spec": {"replicas": want},
        "status": {"observedGeneration": observed, **full},
    }


READY_BOTH = [pod("a", "tpu-node", True), pod("b", "l4-node", True)]


@pytest.mark.parametrize(
    ("dep", "pods", "done", "reason"),
    [
        (None, [], False, "does not exist"),
        (deployment(observed=1), READY_BOTH, False, "not seen the newest spec"),
        (deployment(updatedReplicas=1), READY_BOTH, False, "1 of 2 replicas updated"),
        (deployment(replicas=3), READY_BOTH, False, "1 old replicas"),
        (deployment(availableReplicas=1), READY_BOTH, False, "1 of 2 updated replicas available"),
        (deployment(), [pod("a", "tpu-node", True), pod("b", None, False)], False, "1 of 2 pods Ready"),
        (deployment(), [*READY_BOTH, pod("c", "tpu-node", True, deleting=True)], True, "2 of 2 replicas Ready"),
        (deployment(), READY_BOTH, True, "2 of 2 replicas Ready (gpu=1, tpu=1)"),
    ],
)
def test_rollout_state(dep: Any, pods: list[dict[str, Any]], done: bool, reason: str) -> None:
    state = rollout_state(dep, pods, NODES)
    assert state.done is done
    assert reason in state.reason


def test_placements_name_each_pods_accelerator() -> None:
    placed = placements([pod("b", "cpu-node", True), pod("a", "tpu-node", False), pod("c", None, False)], NODES)
    assert [(p.name, p.accelerator, p.ready) for p in placed] == [
        ("a", "tpu", False),
        ("b", None, True),
        ("c", None, False),
    ]
    assert placed[1].ready_at is not None and placed[0].ready_at is None


def test_leftovers() -> None:
    assert leftovers([], [], []) == []
    assert leftovers([pod("a", None, False)], [{"metadata": {"name": "svc"}}], [{"metadata": {"name": "cc"}}]) == [
        "pod/a",
        "service/svc",
        "computeclass/cc",
    ]


MODELS = {"data": [{"id": "interlude", "root": CKPT}]}
COMPLETION = {"model": "interlude", "choices": [{"text": " alpha beta"}]}


@pytest.mark.parametrize(
    ("models", "completion", "uri", "problem"),
    [
        (MODELS, COMPLETION, CKPT, None),
        (MODELS, COMPLETION, CKPT.rstrip("/") + "/", None),  # vLLM reports the model as given, slash or not
        (MODELS, COMPLETION, "gs://b/interlude/run/finetune", "/v1/models serves"),  # a prefix is another model
        (MODELS, COMPLETION, "gs://b/interlude/other/finetune/", "/v1/models serves"),
        ({"data": [{"id": "other", "root": CKPT}]}, COMPLETION, CKPT, "nothing"),
        (MODELS, {**COMPLETION, "model": "other"}, CKPT, "answered for model 'other'"),
        (MODELS, {"model": "interlude", "choices": [{"text": "  "}]}, CKPT, "no generated text"),
        (MODELS, {"model": "interlude"}, CKPT, "no generated text"),
    ],
)
def test_smoke_problems(models: Any, completion: Any, uri: str, problem: str | None) -> None:
    found = smoke_problems(models, completion, "interlude", uri)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0], found


def test_a_fuse_served_replica_reports_the_mount_as_its_root() -> None:
    """vLLM's root is the model it was started with: the FUSE mount of the export on an image without the GCS
    streamer. That root proves the export only where the rendered pod mounts this export there."""
    from interlude.serving.loading import FUSE_MOUNT, served_roots
    from interlude.serving.spec import ServeSpec
    from interlude.serving.tables import load_table

    fused = {"data": [{"id": "interlude", "root": FUSE_MOUNT}]}
    roots = served_roots(ServeSpec(checkpoint_uri=CKPT), load_table())
    assert roots == {CKPT.rstrip("/"), FUSE_MOUNT}  # default images: TPU streams, GPU (vLLM 0.11.0) mounts
    assert smoke_problems(fused, COMPLETION, "interlude", CKPT, roots) == []
    assert smoke_problems(fused, COMPLETION, "interlude", CKPT) != []  # without the roots the mount is not the URI
    streamed_only = served_roots(ServeSpec(checkpoint_uri=CKPT, model_loader="runai_streamer"), load_table())
    assert streamed_only == {CKPT.rstrip("/")}
