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


# https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus (single-host rows: v6e and v5e 1/4/8 chips).
SHAPES: dict[str, GkeTpuShape] = {
    "v6e-1": GkeTpuShape("tpu-v6e-slice", "1x1", "ct6e-standard-1t", 1),
    "v6e-4": GkeTpuShape("tpu-v6e-slice", "2x2", "ct6e-standard-4t", 4),
    "v6e-8": GkeTpuShape("tpu-v6e-slice", "2x4", "ct6e-standard-8t", 8),
    "v5litepod-1": GkeTpuShape("tpu-v5-lite-podslice", "1x1", "ct5lp-hightpu-1t", 1),
    "v5litepod-4": GkeTpuShape("tpu-v5-lite-podslice", "2x2", "ct5lp-hightpu-4t", 4),
    "v5litepod-8": GkeTpuShape("tpu-v5-lite-podslice", "2x4", "ct5lp-hightpu-8t", 8),
}

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
) -> dict[str, Any]:
    """The run's JobSet: one replicated Job of one pod on one TPU VM, running the workload's agent.

    :param node_pool: pin the pod to this node pool (the pool the run created); None: any pool of the shape.
    """
    from interlude import naming

    shape = shape_for(tpu_type)
    if (problem := image_problem(image)) is not None:
        raise ValueError(problem)
    name = short_name(run_key)
    labels = naming.labels(run_key, dag_id)
    selector = {LABEL_ACCELERATOR: shape.accelerator, LABEL_TOPOLOGY: shape.topology}
    if node_pool:
        selector["cloud.google.com/gke-nodepool"] = node_pool
    chips = {TPU_RESOURCE: str(shape.chips)}
    env = [
        {"name": CHECKPOINT_PREFIX_ENV, "value": f"gs://{bucket}/{naming.checkpoint_prefix(run_key)}"},
        {"name": BOOT_ID_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a failed pod fails its Job; the JobSet recreates the Jobs (failurePolicy)
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "nodeSelector": selector,
        "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
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
