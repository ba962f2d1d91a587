"""The run's JobSet, checked like the other kinds: the JobSet CRD's structural schema (the copy the local GKE
admits with, from kubernetes-sigs/jobset) with unknown fields refused, and its Job template with Kubernetes'
own strict batch/v1 schema; plus what GKE's TPU docs ask of a TPU pod and what the workload needs."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from interlude.stage.jobset import (
    SHAPES,
    agent_argv,
    image_problem,
    render_jobset,
    shape_for,
    short_name,
)

SCHEMA = Path(__file__).parents[4] / "include/interlude_localcloud/gke/jobset.schema.json"
RUN_KEY = "interlude-training-manual-2024-01-abcdefghij"[:29] + "-abcdefghij"
IMAGE = "us-docker.pkg.dev/my-project/interlude/workload:1.2"


def _strict(schema: Any) -> Any:
    """The CRD schema with every object closed (a structural CRD prunes unknown fields; a render must not rely
    on pruning): additionalProperties false wherever properties are declared without another rule."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        open_ = out.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in out and "additionalProperties" not in out and not open_:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _jobset(**kw: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "run_key": RUN_KEY,
        "dag_id": "interlude_training",
        "bucket": "my-bucket",
        "tpu_type": "v6e-4",
        "image": IMAGE,
        "idle_poll": 0.5,
    }
    return render_jobset(**{**args, **kw})


def _problems(obj: dict[str, Any]) -> list[str]:
    schema = _strict(json.loads(SCHEMA.read_text()))
    errors = jsonschema.Draft7Validator(schema).iter_errors(obj)
    out = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
    for rj in obj["spec"]["replicatedJobs"]:
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}, "spec": rj["template"]["spec"]}
        try:
            kubernetes_validate.validate(job, "1.33.0", strict=True)
        except kubernetes_validate.ValidationError as exc:
            out.append(f"job: {'.'.join(map(str, exc.absolute_path))}: {exc.message}")
    return out


@pytest.mark.parametrize("tpu_type", sorted(SHAPES))
def test_every_shape_renders_a_jobset_both_schemas_accept(tpu_type: str) -> None:
    assert _problems(_jobset(tpu_type=tpu_type)) == []


def test_the_schema_check_can_fail() -> None:
    bad = _jobset()
    bad["spec"]["replicatedJobs"][0]["replicas"] = "one"
    assert any("replicas" in p for p in _problems(bad))
    extra = _jobset()
    extra["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    assert _problems(extra)


def test_tpu_placement_follows_gkes_docs() -> None:
    js = _jobset(tpu_type="v6e-4", node_pool="il-abcdefghij")
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
        "cloud.google.com/gke-tpu-topology": "2x2",
        "cloud.google.com/gke-nodepool": "il-abcdefghij",
    }
    (container,) = pod["containers"]
    assert container["resources"] == {"requests": {"google.com/tpu": "4"}, "limits": {"google.com/tpu": "4"}}
    assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["restartPolicy"] == "Never"
    assert js["spec"]["replicatedJobs"][0]["template"]["spec"]["backoffLimit"] == 0
    assert js["spec"]["failurePolicy"]["maxRestarts"] >= 1


def test_the_pod_runs_the_vm_entrypoint_with_the_runs_names() -> None:
    js = _jobset(fresh_token="tok123")
    (container,) = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == [
        "python",
        "-m",
        "interlude_workload.agent",
        "--bucket",
        "my-bucket",
        "--run-key",
        RUN_KEY,
        "--idle-poll",
        "0.5",
        "--fresh-token",
        "tok123",
    ]
    env = {e["name"]: e for e in container["env"]}
    assert env["INTERLUDE_CHECKPOINT_PREFIX"]["value"] == f"gs://my-bucket/interlude/{RUN_KEY}/"
    assert env["INTERLUDE_BOOT_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert js["metadata"]["labels"]["interlude-run"] == RUN_KEY
    assert js["metadata"]["name"] == short_name(RUN_KEY) == "il-abcdefghij"
    assert "--fresh-token" not in agent_argv("b", RUN_KEY, 1.0, None)


def test_rendering_is_pure_and_repeatable() -> None:
    first = _jobset()
    again = copy.deepcopy(first)
    assert _jobset() == again


@pytest.mark.parametrize("tpu_type", ["v6e-16", "v5p-8", "v4-8", "tpu7x-16", ""])
def test_types_gke_does_not_run_here_are_refused_saying_which_are(tpu_type: str) -> None:
    with pytest.raises(ValueError, match="v6e-4"):
        shape_for(tpu_type)


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        (IMAGE, True),
        ("python:3.11-slim", True),
        ("localhost:5000/trainer@sha256:" + "a" * 64, True),
        ("Upper/case", False),
        ("trainer; rm -rf /", False),
        ("trainer:$(id)", False),
        ("", False),
        ("a" * 300, False),
    ],
)
def test_image_references(image: str, ok: bool) -> None:
    assert (image_problem(image) is None) is ok
    if not ok:
        with pytest.raises(ValueError):
            _jobset(image=image)


@pytest.mark.parametrize(
    ("gpu", "count", "machine"), [("nvidia-l4", 1, "g2-standard-8"), ("nvidia-h100-80gb", 8, "a3-highgpu-8g")]
)
def test_a_gpu_jobset_asks_gke_for_its_gpus_and_runs_the_same_agent_on_the_same_prefix(
    gpu: str, count: int, machine: str
) -> None:
    """GKE's GPU docs: nodeSelector cloud.google.com/gke-accelerator, nvidia.com/gpu in limits, the nvidia.com/gpu
    taint tolerated; no TPU selector or resource; the command and checkpoint prefix are the TPU JobSet's."""
    tpu = _jobset(node_pool="il-abcdefghij")
    obj = _jobset(tpu_type=gpu, gpu_count=count, machine_type=machine, node_pool="il-abcdefghij-gpu")
    assert _problems(obj) == []
    pod = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": gpu,
        "cloud.google.com/gke-nodepool": "il-abcdefghij-gpu",
    }
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": str(count)},
        "limits": {"nvidia.com/gpu": str(count)},
    }
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    tpu_pod = tpu["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert container["command"] == tpu_pod["containers"][0]["command"]
    assert container["env"] == tpu_pod["containers"][0]["env"], "the same checkpoint prefix and boot id"
    assert obj["metadata"]["name"] == tpu["metadata"]["name"]
    with pytest.raises(ValueError, match="machine type"):
        _jobset(tpu_type="nvidia-b999")


def test_an_ironwood_pod_asks_for_one_4_chip_tpu7x_vm() -> None:
    """tpu7x-8 (2 TensorCores a chip) is one tpu7x-standard-4t VM, topology 2x2x1 (GKE's Ironwood page)."""
    js = _jobset(tpu_type="tpu7x-8", node_pool="il-abcdefghij")
    pod = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-accelerator"] == "tpu7x"
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "2x2x1"
    (container,) = pod["containers"]
    assert container["resources"]["limits"] == {"google.com/tpu": "4"}
