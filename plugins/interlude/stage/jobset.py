"""The JobSet a run trains in on GKE: rendered from the run's names, pure (no cluster, no Airflow).

Large TPU training on GKE runs as a JobSet (``jobset.x-k8s.io/v1alpha2``; xpk and the MaxText recipes do):
one child Job per slice, its pods recreated by the JobSet controller when a Job fails, which is what happens
when GKE drains a node for host maintenance. The pod runs the same entrypoint a TPU VM's startup script
starts (``python -m interlude_workload.agent``): the agent runs every stage plan the control plane writes to
GCS, in order, resuming each from its latest committed Orbax step, and commits its current step on SIGTERM
(GKE's graceful termination at the maintenance window). So a GKE run keeps the VM run's contract: one
starter of the workload per slice, checkpoints under the run's prefix, plans from Airflow.

TPU placement follows Google's GKE TPU docs
(https://cloud.google.com/kubernetes-engine/docs/how-to/tpus,
https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus): nodeSelector
``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``, the ``google.com/tpu``
resource (chips per host) in requests and limits, a toleration of the ``google.com/tpu`` taint. Only
single-host slices are rendered here (one pod, every chip of one VM); a multi-host slice needs the workers'
coordinator wiring and is refused naming ``tpu_types``.

GPU node pools (where a TPU stockout walks the tree to) follow Google's GKE GPU docs
(https://cloud.google.com/kubernetes-engine/docs/how-to/gpus): nodeSelector ``cloud.google.com/gke-accelerator``
(``nvidia-l4``, ``nvidia-h100-80gb``), the ``nvidia.com/gpu`` resource in limits, a toleration of the
``nvidia.com/gpu`` taint GKE puts on GPU nodes. The pod runs the same agent on the same checkpoint prefix: the
Orbax checkpoint a TPU pod wrote restores on the GPU pod (interlude.capacity.failover.PORTABLE_FORMATS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

API_VERSION = "jobset.x-k8s.io/v1alpha2"
REPLICATED_JOB = "slice"
CONTAINER = "workload"
LABEL_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
LABEL_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
GPU_LABEL_ACCELERATOR = "cloud.google.com/gke-accelerator"
GPU_RESOURCE = "nvidia.com/gpu"
RUN_LABEL = "interlude-run"
#: Env naming the run's checkpoint prefix (gs://BUCKET/interlude/RUN_KEY/): for the user's eyes and tools; the
#: agent derives every object name from --bucket and --run-key through interlude_workload.layout.
CHECKPOINT_PREFIX_ENV = "INTERLUDE_CHECKPOINT_PREFIX"
BOOT_ID_ENV = "INTERLUDE_BOOT_ID"  # interlude_workload.boot: a pod's uid changes with every recreated pod
#: A maintenance is one failed Job (its pod evicted): the JobSet restarts its Jobs. This many restarts, then the
#: JobSet fails (a workload crashing at start must not loop forever; the stage fails then, saying so).
MAX_RESTARTS = 10
#: Kubernetes' default; GKE sends SIGTERM at the window and SIGKILL after this (the agent commits its step first).
TERMINATION_GRACE_SECONDS = 30


@dataclass(frozen=True)
class GkeTpuShape:
    """One single-host GKE TPU node shape (plan-tpus: accelerator label, topology, machine type, chips)."""

    accelerator: str
    topology: str
    machine_type: str
    chips: int


# https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus (single-host rows: v6e and v5e 1/4/8 chips, TPU7x).
SHAPES: dict[str, GkeTpuShape] = {
    "v6e-1": GkeTpuShape("tpu-v6e-slice", "1x1", "ct6e-standard-1t", 1),
    "v6e-4": GkeTpuShape("tpu-v6e-slice", "2x2", "ct6e-standard-4t", 4),
    "v6e-8": GkeTpuShape("tpu-v6e-slice", "2x4", "ct6e-standard-8t", 8),
    "v5litepod-1": GkeTpuShape("tpu-v5-lite-podslice", "1x1", "ct5lp-hightpu-1t", 1),
    "v5litepod-4": GkeTpuShape("tpu-v5-lite-podslice", "2x2", "ct5lp-hightpu-4t", 4),
    "v5litepod-8": GkeTpuShape("tpu-v5-lite-podslice", "2x4", "ct5lp-hightpu-8t", 8),
    # Ironwood: one 4-chip VM, tpu7x-standard-4t, topology 2x2x1 (2 TensorCores a chip: tpu7x-8);
    # https://cloud.google.com/kubernetes-engine/docs/concepts/tpu-ironwood, https://cloud.google.com/tpu/docs/tpu7x
    "tpu7x-8": GkeTpuShape("tpu7x", "2x2x1", "tpu7x-standard-4t", 4),
}


@dataclass(frozen=True)
class GkeGpuShape:
    """One GKE GPU node shape: the accelerator (the node label's value), its machine type and GPUs per node."""

    accelerator: str
    machine_type: str
    count: int


# https://cloud.google.com/kubernetes-engine/docs/how-to/gpus (G2 carries L4, A3 High H100 80GB; the machine type
# fixes the count) and https://cloud.google.com/compute/docs/gpus (the machine types per GPU).
GPU_MACHINE_TYPES: dict[str, str] = {
    "nvidia-l4": "g2-standard-8",
    "nvidia-h100-80gb": "a3-highgpu-8g",
    "nvidia-a100-80gb": "a2-ultragpu-1g",
    "nvidia-tesla-t4": "n1-standard-8",
}


def gpu_shape_for(gpu_type: str, count: int = 1, machine_type: str | None = None) -> GkeGpuShape:
    """The GKE node shape for ``count`` GPUs of ``gpu_type`` (the candidate's machine type, else Google's usual one)."""
    if not gpu_type.startswith("nvidia-"):
        raise ValueError(f"{gpu_type!r} is not a GKE GPU type (nvidia-...)")
    machine = machine_type or GPU_MACHINE_TYPES.get(gpu_type)
    if machine is None:
        raise ValueError(f"{gpu_type!r}: no machine type known for it on GKE (one of {', '.join(GPU_MACHINE_TYPES)})")
    if count < 1:
        raise ValueError(f"{gpu_type!r}: a GPU node pool needs at least one GPU per node (got {count})")
    return GkeGpuShape(gpu_type, machine, count)


def has_shape(accelerator_type: str) -> bool:
    """Interlude renders a JobSet for this type on GKE (a single-host TPU shape, or any known GPU)."""
    try:
        if accelerator_type.startswith("nvidia-"):
            gpu_shape_for(accelerator_type)
        else:
            shape_for(accelerator_type)
        return True
    except ValueError:
        return False


# A container image reference: [registry[:port]/]path[:tag][@sha256:digest], lower-case path components.
IMAGE_RE = re.compile(
    r"^(?:[a-z0-9.-]+(?::[0-9]{1,5})?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)


def shape_for(tpu_type: str) -> GkeTpuShape:
    """The GKE node shape of a TPU type; ValueError (saying which types are) for one GKE runs not here."""
    try:
        return SHAPES[tpu_type]
    except KeyError:
        raise ValueError(
            f"{tpu_type!r} is not a single-host TPU type Interlude runs on GKE (one of {', '.join(SHAPES)})"
        ) from None


def image_problem(image: str) -> str | None:
    """None for a container image reference, else why not (the param's check names the param)."""
    if len(image) > 255 or not IMAGE_RE.match(image):
        return f"{image!r} is not a container image reference (REGISTRY/PATH[:TAG][@sha256:DIGEST])"
    return None


def short_name(run_key: str) -> str:
    """A run's GKE object name (JobSet, node pool): ``il-`` + the run key's hash (node pools allow 40 chars,
    and a JobSet's name reaches its pods' names). The run key ends with its 10-character hash (interlude.naming)."""
    return f"il-{run_key.rsplit('-', 1)[-1]}"


def agent_argv(bucket: str, run_key: str, idle_poll: float, fresh_token: str | None) -> list[str]:
    """The pod's command: the agent a TPU VM's startup script starts (argv, no shell)."""
    argv = ["python", "-m", "interlude_workload.agent", "--bucket", bucket, "--run-key", run_key]
    argv += ["--idle-poll", repr(float(idle_poll))]
    if fresh_token:
        argv += ["--fresh-token", fresh_token]
    return argv


def render_jobset(
    *,
    run_key: str,
    dag_id: str,
    bucket: str,
    tpu_type: str,
    image: str,
    idle_poll: float,
    fresh_token: str | None = None,
    node_pool: str | None = None,
    namespace: str = "default",
    gpu_count: int = 1,
    machine_type: str | None = None,
) -> dict[str, Any]:
    """The run's JobSet: one replicated Job of one pod on one TPU VM (or one GPU node), running the workload's agent.

    :param tpu_type: the accelerator: a single-host TPU type (``v6e-4``) or a GPU type (``nvidia-l4``).
    :param node_pool: pin the pod to this node pool (the pool the run created); None: any pool of the shape.
    :param gpu_count: GPUs the pod takes (GPU types only): every GPU of its node.
    :param machine_type: the GPU node's machine type (GPU types only; None: Google's usual one for the GPU).
    """
    from interlude import naming

    if (problem := image_problem(image)) is not None:
        raise ValueError(problem)
    name = short_name(run_key)
    labels = naming.labels(run_key, dag_id)
    if tpu_type.startswith("nvidia-"):
        gpu = gpu_shape_for(tpu_type, gpu_count, machine_type)
        selector = {GPU_LABEL_ACCELERATOR: gpu.accelerator}
        chips, taint = {GPU_RESOURCE: str(gpu.count)}, GPU_RESOURCE
    else:
        shape = shape_for(tpu_type)
        selector = {LABEL_ACCELERATOR: shape.accelerator, LABEL_TOPOLOGY: shape.topology}
        chips, taint = {TPU_RESOURCE: str(shape.chips)}, TPU_RESOURCE
    if node_pool:
        selector["cloud.google.com/gke-nodepool"] = node_pool
    env = [
        {"name": CHECKPOINT_PREFIX_ENV, "value": f"gs://{bucket}/{naming.checkpoint_prefix(run_key)}"},
        {"name": BOOT_ID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a failed pod fails its Job; the JobSet recreates the Jobs (failurePolicy)
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "nodeSelector": selector,
        "tolerations": [{"key": taint, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "command": agent_argv(bucket, run_key, idle_poll, fresh_token),
                "env": env,
                "resources": {"requests": dict(chips), "limits": dict(chips)},
            }
        ],
    }
    job_spec = {
        "parallelism": 1,
        "completions": 1,
        "backoffLimit": 0,
        "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "failurePolicy": {"maxRestarts": MAX_RESTARTS},
            "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec}}],
        },
    }
