"""ServeSpec: the one typed record of a serving run's parameters (the serving DAG's RunSpec).

Same contract as `interlude.training.spec.RunSpec`: one default per param, the trigger form generated from the
same table (`form_schema()`), every refusal names its param, and all problems are reported at once, in
the first task, before anything is applied to a cluster. Checks that need the table of TPU shapes and
images (`plugins/interlude/serving/serving_runtimes.yaml`) are here too because they are pure; checks that need the
cluster (capacity, node pools) are not.

The model comes from the fine-tuning DAG's Asset event (passed as `resolved`) or from the `checkpoint_uri`
param: a Hugging Face model directory in Cloud Storage (the stage's export), which is what vLLM loads;
`delete` needs none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlude.params import (
    CONTROL,
    ParamsError,
    coerce_params,
    form_schema,
    param,
    param_names,
    schema_problems,
    shown,
)
from interlude.serving.images import parse_image
from interlude.serving.tables import ServingTable, TpuShape, load_table
from interlude.training.spec_checks import bucket_problem

ACTIONS = ("deploy", "update", "delete")
SERVICE_TYPES = ("ClusterIP", "LoadBalancer")
GPU_DRIVER_CHANNELS = ("default", "latest")
MODEL_LOADERS = ("auto", "runai_streamer", "gcsfuse")
MAX_REPLICAS = 64
HPA_METRIC = "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"
"""vLLM's queue length as Managed Prometheus exports it to the HPA through the Custom Metrics Stackdriver
Adapter (https://cloud.google.com/kubernetes-engine/docs/tutorials/serve-vllm-tpu#autoscale)."""

# https://cloud.google.com/kubernetes-engine/docs/how-to/creating-a-zonal-cluster (name: up to 40 chars),
# https://cloud.google.com/compute/docs/regions-zones (region / zone shapes),
# https://kubernetes.io/docs/concepts/overview/working-with-objects/names/ (RFC 1123 labels).
CLUSTER_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
LOCATION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]{1,2}(-[a-z])?$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")  # leaves room for -node-facts etc. in 63
NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
TOPOLOGY_RE = re.compile(r"^[1-9][0-9]?x[1-9][0-9]?(x[1-9][0-9]?)?$")
# gs://BUCKET/OBJECT-PREFIX (https://cloud.google.com/storage/docs/objects#naming): no whitespace, no
# '.'/'..' segments, at most 1024 bytes of object name.
GS_URI_RE = re.compile(r"^gs://(?P<bucket>[^/]+)/(?P<path>[^\s]+)$")
# https://cloud.google.com/iam/docs/service-accounts-create#creating (6-30 characters, the account's domain)
GSA_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9.:-]{3,61}\.gserviceaccount\.com$")


class ServeSpecError(ParamsError):
    """Bad serving input, found before anything is applied. Retrying cannot fix it: the params must change."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems, "invalid serving parameters")


_param = param


def _enum(default: str, values: tuple[str, ...], description: str) -> Any:
    return _param(default, {"type": "string", "enum": list(values)}, description)


def _int(default: int, low: int, high: int, description: str) -> Any:
    return _param(default, {"type": "integer", "minimum": low, "maximum": high}, description)


def _num(default: float, low: float, high: float, description: str) -> Any:
    return _param(default, {"type": "number", "minimum": low, "maximum": high}, description)


def _text(default: str, description: str) -> Any:
    return _param(default, {"type": "string", "minLength": 1}, description)


@dataclass(frozen=True)
class ServeSpec:
    """Everything the serving DAG needs, with the single default of every param. Durations in seconds."""

    # -- what and where -------------------------------------------------------------------------------
    action: str = _enum(
        "deploy",
        ACTIONS,
        "deploy: create or converge; update: roll to a new checkpoint or "
        "images; delete: remove everything this spec created.",
    )
    checkpoint_uri: str | None = _param(
        None,
        {"type": ["null", "string"]},
        "gs://BUCKET/PATH of the fine-tuned model's Hugging Face export (config.json, *.safetensors, tokenizer "
        "files); empty = the one named by the triggering Asset event.",
    )
    cluster: str = _text("interlude-serving", "GKE cluster name.")
    location: str = _text("us-central1", "GKE cluster location (region or zone).")
    namespace: str = _text("default", "Kubernetes namespace.")
    name: str = _text("interlude-vllm", "Name of the Deployment, Service, HPA and ComputeClass.")
    # -- how many -------------------------------------------------------------------------------------
    replicas_min: int = _int(1, 1, MAX_REPLICAS, "HPA minimum replicas.")
    replicas_max: int = _int(4, 1, MAX_REPLICAS, "HPA maximum replicas.")
    # -- on what --------------------------------------------------------------------------------------
    tpu_type: str = _text(
        "v6e-1", "Cloud TPU type of one serving node (single host: v6e-1/4/8, v5litepod-1/4/8, v5p-8, v4-8)."
    )
    tpu_topology: str | None = _param(
        None, {"type": ["null", "string"]}, "TPU topology; empty = the one of tpu_type (v6e-8 -> 2x4)."
    )
    tpu_spot: bool = _param(False, {"type": "boolean"}, "Prefer Spot TPU capacity in the ComputeClass.")
    gpu_type: str = _text("nvidia-l4", "GKE GPU type of the fallback (second priority).")
    gpu_count: int = _int(1, 1, 16, "GPUs per fallback node.")
    gpu_driver_version: str = _enum("latest", GPU_DRIVER_CHANNELS, "GKE GPU driver channel of the GPU nodes.")
    tpu_nodepools: tuple[str, ...] = _param(
        (),
        {"type": "array", "items": {"type": "string"}},
        "Existing TPU node pools (empty: GKE creates them from the class).",
    )
    gpu_nodepools: tuple[str, ...] = _param(
        (),
        {"type": "array", "items": {"type": "string"}},
        "Existing GPU node pools (empty: GKE creates them from the class).",
    )
    # TPU: the first vLLM TPU release that streams the export from gs:// (serving_runtimes.yaml, model_loaders).
    # GPU: the newest release whose CUDA (12.8) the L4's driver channels run; it reads the export through a
    # Cloud Storage FUSE volume (the GCS streamer came with 0.11.1, built for CUDA 12.9).
    tpu_image: str = _text("docker.io/vllm/vllm-tpu:v0.18.0", "vLLM TPU image (tag or @sha256 digest).")
    gpu_image: str = _text("docker.io/vllm/vllm-openai:v0.11.0", "vLLM GPU image (tag or @sha256 digest).")
    model_loader: str = _enum(
        "auto",
        MODEL_LOADERS,
        "How vLLM reads the export from Cloud Storage: runai_streamer (--load-format=runai_streamer from gs://), "
        "gcsfuse (a Cloud Storage FUSE CSI volume), auto = the streamer where the image has it, else FUSE.",
    )
    gcp_service_account: str | None = _param(
        None,
        {"type": ["null", "string"]},
        "Google service account the pods act as through Workload Identity (the Kubernetes ServiceAccount is "
        "annotated iam.gke.io/gcp-service-account); empty = grant the bucket to the ServiceAccount's own principal.",
    )
    # -- the server -----------------------------------------------------------------------------------
    served_model_name: str = _text("interlude", "Model name clients send in requests.")
    max_model_len: int = _int(
        0,
        0,
        1_048_576,
        "vLLM --max-model-len (at least 16); 0 = the model's own context (max_position_embeddings of its "
        "config.json), which vLLM refuses to exceed.",
    )
    service_type: str = _enum("ClusterIP", SERVICE_TYPES, "How the Service is exposed.")
    hpa_metric: str = _text(HPA_METRIC, "Pods metric the HPA averages (vLLM's waiting requests).")
    hpa_target_waiting: float = _num(1.0, 0.1, 1000, "Target average waiting requests per pod.")
    # -- behaviour ------------------------------------------------------------------------------------
    fallback_after_seconds: float = _num(
        300.0, 0, 86400, "TPU pods pending for lack of capacity this long -> new replicas go to GPU."
    )
    tpu_retry_seconds: float = _num(900.0, 60, 86400, "After a fallback, try TPU-first again this often.")
    quiet_waiting_requests: float = _num(
        0.5, 0, 1000, "A maintenance drain waits for the average waiting requests to drop to this (a quiet moment)."
    )
    maintenance_margin_seconds: float = _num(
        600.0, 0, 7 * 86400, "Drain at the latest this long before a node's scheduled maintenance, quiet or not."
    )
    maintenance_perform_early: bool = _param(
        True, {"type": "boolean"}, "Once a node under maintenance is drained, start its maintenance at once."
    )
    watch_minutes: float = _num(
        0.0, 0, 1440, "After the smoke test, watch for node maintenance this long (0: no watch step)."
    )
    load_requests: int = _int(0, 0, 10_000, "Completions the watch step sends through the Service (a drill).")
    load_concurrency: int = _int(4, 1, 64, "Requests in flight at once during the watch step's load.")
    rollout_timeout_seconds: float = _num(1800.0, 60, 86400, "How long the rollout may take.")
    poll_seconds: float = _num(10.0, 0.1, 3600, "How often triggers look at the cluster.")
    plan_only: bool = _param(False, {"type": "boolean"}, "Validate and render; apply nothing.")

    # ------------------------------------------------------------------ construction
    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        return param_names(cls)

    @classmethod
    def form_schema(cls) -> dict[str, tuple[Any, dict[str, Any]]]:
        """Each param's default and JSON schema, for the DAG's `Param`s."""
        return form_schema(cls)

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], *, checkpoint_uri: str | None = None, table: ServingTable | None = None
    ) -> ServeSpec:
        """Check and type the params (every problem at once, each naming its param), then build the spec.

        `checkpoint_uri` is the triggering Asset event's URI; an explicit param wins over it.
        """
        values, problems = coerce_params(cls, params)
        if problems:
            raise ServeSpecError(problems)
        if values.get("checkpoint_uri") is None and checkpoint_uri:
            values["checkpoint_uri"] = checkpoint_uri
        spec = cls(**values)
        spec.check(table)
        return spec

    def check(self, table: ServingTable | None = None) -> None:
        problems = spec_problems(self, table or load_table())
        if problems:
            raise ServeSpecError(problems)

    # ------------------------------------------------------------------ JSON (XCom, trigger kwargs)
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("tpu_nodepools", "gpu_nodepools"):
            out[name] = list(out[name])
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | ServeSpec) -> ServeSpec:
        if isinstance(data, ServeSpec):
            return data
        values = {k: v for k, v in data.items() if k in set(cls.param_names())}
        for name in ("tpu_nodepools", "gpu_nodepools"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServeSpec:
        return cls.from_dict(json.loads(text))

    # ------------------------------------------------------------------ derived
    def digest(self) -> str:
        """sha256 of what the manifests depend on (not action/plan_only/timing), for labels and annotations."""
        ignored = {
            "action",
            "plan_only",
            "rollout_timeout_seconds",
            "poll_seconds",
            "watch_minutes",
            "load_requests",
            "load_concurrency",
            "maintenance_perform_early",
        }
        data = {k: v for k, v in self.to_dict().items() if k not in ignored}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def tpu_shape(self, table: ServingTable | None = None) -> TpuShape:
        return (table or load_table()).tpu_shapes[self.tpu_type]

    def replace(self, **changes: Any) -> ServeSpec:
        return dataclasses.replace(self, **changes)


def checkpoint_problem(uri: str) -> str | None:
    """gs://BUCKET/PATH with a valid bucket and a clean object path, else why not (naming the param)."""
    match = GS_URI_RE.match(uri)
    if match is None:
        return f"checkpoint_uri: {shown(uri)} is not gs://BUCKET/PATH"
    if (problem := bucket_problem(match.group("bucket"))) is not None:
        return "checkpoint_uri: " + problem
    path = match.group("path")
    if CONTROL.search(path) or len(path.encode()) > 1024:
        return f"checkpoint_uri: {shown(uri)} has control characters or an object path over 1024 bytes"
    if any(part in (".", "..") for part in path.split("/")) or "//" in path:
        return f"checkpoint_uri: {shown(uri)} has an empty, '.' or '..' path segment"
    return None


def _range_problems(spec: ServeSpec) -> list[str]:
    out = schema_problems(spec)
    if 0 < spec.max_model_len < 16:
        out.append(f"max_model_len: must be 0 (the model's own) or at least 16 (got {spec.max_model_len})")
    if spec.replicas_min > spec.replicas_max:
        out.append(f"replicas_min: must not exceed replicas_max ({spec.replicas_min} > {spec.replicas_max})")
    return out


def _shape_problems(spec: ServeSpec) -> list[str]:
    out: list[str] = []
    shapes = (
        ("cluster", spec.cluster, CLUSTER_RE),
        ("location", spec.location, LOCATION_RE),
        ("name", spec.name, NAME_RE),
        ("namespace", spec.namespace, NAMESPACE_RE),
        ("served_model_name", spec.served_model_name, re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]{0,127}$")),
    )
    for name, value, pattern in shapes:
        if not pattern.match(value):
            out.append(f"{name}: {shown(value)} does not have the shape GKE/Kubernetes expects ({pattern.pattern})")
    for name, pools in (("tpu_nodepools", spec.tpu_nodepools), ("gpu_nodepools", spec.gpu_nodepools)):
        out += [f"{name}: {shown(p)} is not a node pool name" for p in pools if not CLUSTER_RE.match(p)]
    if spec.gcp_service_account is not None and not GSA_RE.match(spec.gcp_service_account):
        out.append(
            f"gcp_service_account: {shown(spec.gcp_service_account)} is not a service account email "
            "(NAME@PROJECT.iam.gserviceaccount.com)"
        )
    if not re.match(r"^[-A-Za-z0-9_.|:/]{1,200}$", spec.hpa_metric):
        out.append(f"hpa_metric: {shown(spec.hpa_metric)} is not a metric name")
    for name in ("tpu_image", "gpu_image"):
        try:
            parse_image(name, getattr(spec, name))
        except ValueError as exc:
            out.append(str(exc))  # images.py quotes the value as params.shown does
    return out


def _accelerator_problems(spec: ServeSpec, table: ServingTable) -> list[str]:
    out: list[str] = []
    shape = table.tpu_shapes.get(spec.tpu_type)
    if shape is None:
        out.append(
            f"tpu_type: {shown(spec.tpu_type)} is not a single-host TPU type vLLM can serve on GKE "
            f"(known: {', '.join(sorted(table.tpu_shapes))})"
        )
    elif spec.tpu_topology is not None:
        if not TOPOLOGY_RE.match(spec.tpu_topology):
            out.append(f"tpu_topology: {shown(spec.tpu_topology)} is not a topology (like 2x4 or 2x2x1)")
        elif spec.tpu_topology != shape.topology:
            out.append(
                f"tpu_topology: {shown(spec.tpu_topology)} does not match tpu_type {spec.tpu_type} "
                f"(which is {shape.topology}; see {shape.source})"
            )
    if spec.tpu_spot and spec.tpu_nodepools:
        out.append("tpu_spot: has no effect with tpu_nodepools (an existing pool is Spot or not); set one of them")
    gpu = table.gpu_types.get(spec.gpu_type)
    if gpu is None:
        known = ", ".join(sorted(table.gpu_types))
        out.append(f"gpu_type: {shown(spec.gpu_type)} is not a known GKE GPU type (known: {known})")
    elif spec.gpu_count not in gpu.counts:
        out.append(
            f"gpu_count: {spec.gpu_type} nodes come with {', '.join(map(str, gpu.counts))} GPUs (got {spec.gpu_count})"
        )
    return out


def _checkpoint_problems(spec: ServeSpec) -> list[str]:
    if spec.checkpoint_uri is None:
        if spec.action == "delete":
            return []
        return ["checkpoint_uri: no checkpoint given (set the param or trigger from the fine-tuned checkpoint asset)"]
    problem = checkpoint_problem(spec.checkpoint_uri)
    return [] if problem is None else [problem]


def spec_problems(spec: ServeSpec, table: ServingTable) -> list[str]:
    """Every problem with the spec, each naming its param; [] when it is good to render."""
    return (
        _range_problems(spec) + _shape_problems(spec) + _accelerator_problems(spec, table) + _checkpoint_problems(spec)
    )
