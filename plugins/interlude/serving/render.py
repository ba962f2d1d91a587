"""The serving manifests, rendered from a ServeSpec by pure functions (dicts; `to_yaml` for the text).

Same spec -> byte-identical YAML (sorted keys, no timestamps, no random names), so a re-apply with
server-side apply changes nothing and `plan_only` shows exactly what would be applied.

Design choices (each is the answer to a question the public TPU/GPU recipe leaves open):

- **ComputeClass** (cloud.google.com/v1): TPU rule first (performance), GPU rule second;
  ``activeMigration.optimizeRulePriority: true`` moves pods back to TPU when TPU capacity returns;
  ``whenUnsatisfiable: DoNotScaleUp`` so a pod never lands on an unlisted machine. The stockout fallback
  (interlude.serving.policy) re-renders the class GPU-first with active migration off - running TPU
  replicas stay, new replicas go to GPU - and back TPU-first later. No Deployment change, so no rollout.
- **No accelerator requests.** A pod's requests are the sum over its containers and must fit one node;
  requesting ``google.com/tpu`` in one container and ``nvidia.com/gpu`` in the other fits no node, and
  requesting either pins the pod to one hardware kind. So, as the recipe does, the pod requests only
  CPU/memory sized to fit the smallest node of either kind, and the ComputeClass picks the hardware.
- **One replica per node**: a required pod anti-affinity on ``kubernetes.io/hostname``. Without accelerator
  requests nothing else stops the HPA's replicas from packing onto the node that has room (a second vLLM
  cannot open a node's TPU chips, and runs out of memory on its GPU); with it a new replica needs a new node,
  which the ComputeClass takes from the next priority (L4) when the TPU pools are at their limits.
- **What stays privileged.** Without an extended-resource request the device plugins do not add the TPU
  (``/dev/vfio``) or GPU (``/dev/nvidia*``) device nodes to the container's device cgroup; no capability
  grants that, so the two vLLM containers keep ``privileged: true`` - the only thing left of the recipe's
  permissions. Everything else is narrowed: no host network/PID/IPC, the GPU driver directory is mounted
  read-only, the vLLM containers get no service-account token, the init container runs as nobody with
  a read-only root and no capabilities, and the pod uses the RuntimeDefault seccomp profile.
- **One port, one server.** Both containers use port 8000 and only the one matching the node's
  accelerator binds it (the entrypoints idle otherwise). The containers share the pod's network
  namespace, so each container's ``/health`` probe reaches whichever server runs: the pod is Ready when
  its server is, and the Service, the PodMonitoring and the HPA need one port. (Two ports would leave
  the idle container's probe failing forever, and a pod is Ready only when every container is.)
- **TPU type and topology from the node**, through an init container (see interlude.serving.node_facts).
- **replicas are left to the HPA**: the Deployment has no ``spec.replicas``, so an apply never fights it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from interlude.serving import entrypoints, loading, node_facts
from interlude.serving.loading import Loading
from interlude.serving.meta import (
    Manifest,
    annotations_for,
    labels,
    metadata,
    selector_labels,
)
from interlude.serving.spec import ServeSpec
from interlude.serving.tables import ServingTable, load_table
from interlude.serving.traffic import PORT, hpa, pod_disruption_budget, pod_monitoring, service

ORDERS = ("tpu_first", "gpu_first")
TPU_ENTRYPOINT = f"{entrypoints.ENTRYPOINT_DIR}/tpu_serve.sh"
GPU_ENTRYPOINT = f"{entrypoints.ENTRYPOINT_DIR}/gpu_serve.sh"
GPU_DRIVER_HOST_PATH = "/home/kubernetes/bin/nvidia"  # https://cloud.google.com/kubernetes-engine/docs/how-to/gpus
LABEL_CLASS = "cloud.google.com/compute-class"
ANNOTATION_ORDER = "interlude_dev.wiring/priority-order"


def node_reader_name(spec: ServeSpec) -> str:
    """Cluster-scoped names must be unique across namespaces."""
    return f"{spec.namespace}-{spec.name}-node-reader"[:253]


# ---------------------------------------------------------------------- ComputeClass
def _tpu_rule(spec: ServeSpec, table: ServingTable) -> dict[str, Any]:
    if spec.tpu_nodepools:
        return {"nodepools": list(spec.tpu_nodepools)}
    shape = table.tpu_shapes[spec.tpu_type]
    return {
        "tpu": {"type": shape.gke_accelerator, "count": shape.chips, "topology": shape.topology},
        "spot": spec.tpu_spot,
    }


def _gpu_rule(spec: ServeSpec) -> dict[str, Any]:
    if spec.gpu_nodepools:
        return {"nodepools": list(spec.gpu_nodepools)}
    return {"gpu": {"type": spec.gpu_type, "count": spec.gpu_count, "driverVersion": spec.gpu_driver_version}}


def compute_class(spec: ServeSpec, order: str = "tpu_first", table: ServingTable | None = None) -> Manifest:
    """TPU first then GPU (or, during a stockout fallback, GPU first without active migration)."""
    if order not in ORDERS:
        raise ValueError(f"order: {order!r} is not one of {', '.join(ORDERS)}")
    table = table or load_table()
    rules = [_tpu_rule(spec, table), _gpu_rule(spec)]
    meta = metadata(spec, spec.name, namespaced=False)
    meta["annotations"][ANNOTATION_ORDER] = order
    return {
        "apiVersion": "cloud.google.com/v1",
        "kind": "ComputeClass",
        "metadata": meta,
        "spec": {
            "description": f"Interlude vLLM serving of {spec.name}: TPU {spec.tpu_type} first, {spec.gpu_type} second",
            "priorities": rules if order == "tpu_first" else rules[::-1],
            "whenUnsatisfiable": "DoNotScaleUp",
            "activeMigration": {"optimizeRulePriority": order == "tpu_first"},
            "autoscalingPolicy": {"consolidationDelayMinutes": 10},
            "nodePoolAutoCreation": {"enabled": not (spec.tpu_nodepools or spec.gpu_nodepools)},
        },
    }


# ---------------------------------------------------------------------- RBAC + the node-facts script
def _with_annotations(meta: dict[str, Any], extra: Mapping[str, str]) -> dict[str, Any]:
    return {**meta, "annotations": {**meta["annotations"], **extra}}


def node_reader(spec: ServeSpec, table: ServingTable | None = None) -> list[Manifest]:
    """ServiceAccount, ClusterRole (get nodes, nothing else), its binding, and the init container's script."""
    table = table or load_table()
    name = node_reader_name(spec)
    return [
        {
            # the pods' identity: Workload Identity Federation for GKE lets it read the export's bucket
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _with_annotations(metadata(spec, spec.name), loading.service_account_annotations(spec)),
            "automountServiceAccountToken": False,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": metadata(spec, name, namespaced=False),
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": metadata(spec, name, namespaced=False),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": spec.name, "namespace": spec.namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(spec, f"{spec.name}-node-facts"),
            "data": {node_facts.SCRIPT_NAME: node_facts.script(table)},
        },
    ]


# ---------------------------------------------------------------------- Deployment
PRESTOP_SECONDS = 10  # well inside terminationGracePeriodSeconds (60): in-flight requests still finish


def _probes() -> dict[str, Any]:
    def get(period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": "/health", "port": PORT},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": failures,
        }

    # startup: loading and compiling a model can take many minutes (180 x 10 s = 30 min)
    probes = {"startupProbe": get(10, 180), "readinessProbe": get(5, 3), "livenessProbe": get(15, 4)}
    return {**probes, "lifecycle": _drain_pause()}


def _drain_pause() -> dict[str, Any]:
    """A deleted or evicted pod leaves its Service's endpoints while its containers get SIGTERM, at the same
    time: a connection routed just before still reaches it. The preStop pause keeps vLLM listening until every
    node's proxy has dropped the pod (the sleep action needs no shell in the image; Kubernetes 1.30+).
    https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/#hook-handler-implementations"""
    return {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}}


def _serve_args(spec: ServeSpec, parallel: int, model: Loading) -> list[str]:
    """`vllm serve` with the export as the model (a gs:// URI for the streamer, the FUSE mount otherwise);
    interlude.serving.vllm_args checks every flag against vLLM's own parser or its flag table."""
    return [
        "vllm",
        "serve",
        model.model,
        "--host=0.0.0.0",
        f"--port={PORT}",
        f"--served-model-name={spec.served_model_name}",
        # unset: vLLM takes the model's max_position_embeddings (and refuses a larger --max-model-len)
        *([f"--max-model-len={spec.max_model_len}"] if spec.max_model_len else []),
        f"--tensor-parallel-size={parallel}",
        *model.flags,
    ]


def _model_mounts(model: Loading) -> list[dict[str, Any]]:
    return [loading.fuse_mount()] if model.fuse else []


def _requests() -> dict[str, Any]:
    """Sized so the two containers together fit the smallest node of either kind (g2-standard-4, ct6e-standard-1t)."""
    return {"requests": {"cpu": "1", "memory": "4Gi"}}


def _one_replica_per_node(spec: ServeSpec) -> dict[str, Any]:
    """No two replicas on one node: a replica requests no accelerator (see above), so without this the HPA's
    replicas pack onto the TPU node (a second vLLM cannot open its chips; on a GPU node the second runs out of
    memory) instead of the ComputeClass adding nodes - GPU ones when the TPU pool is at its limit.
    https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#inter-pod-affinity-and-anti-affinity"""
    term = {"labelSelector": {"matchLabels": selector_labels(spec)}, "topologyKey": "kubernetes.io/hostname"}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def _privileged() -> dict[str, Any]:
    return {"privileged": True}


def _tpu_container(spec: ServeSpec, table: ServingTable, model: Loading) -> dict[str, Any]:
    chips = table.tpu_shapes[spec.tpu_type].chips
    return {
        "name": "vllm-tpu",
        "image": spec.tpu_image,
        "command": ["/bin/sh", "-c", node_facts.SOURCE_AND_EXEC, "tpu-env"],
        "args": [TPU_ENTRYPOINT, *_serve_args(spec, chips, model)],
        "env": [
            {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "VBAR_CONTROL_SERVICE_URL", "value": "$(NODE_IP):8353"},
            {"name": "TPU_RUNTIME_METRICS_PORTS", "value": "8431"},
        ],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": _requests(),
        "securityContext": _privileged(),
        "volumeMounts": [
            {"name": "node-facts", "mountPath": node_facts.ENV_DIR, "readOnly": True},
            *_model_mounts(model),
        ],
        **_probes(),
    }


def _gpu_container(spec: ServeSpec, model: Loading) -> dict[str, Any]:
    return {
        "name": "vllm-gpu",
        "image": spec.gpu_image,
        "command": [GPU_ENTRYPOINT],
        "args": _serve_args(spec, spec.gpu_count, model),
        "resources": _requests(),
        "securityContext": _privileged(),
        "volumeMounts": [
            {"name": "nvidia-driver", "mountPath": "/usr/local/nvidia", "readOnly": True},
            *_model_mounts(model),
        ],
        **_probes(),
    }


def _init_container(spec: ServeSpec) -> dict[str, Any]:
    return {
        "name": "node-facts",
        "image": spec.tpu_image,
        "command": ["python3", f"{node_facts.SCRIPT_DIR}/{node_facts.SCRIPT_NAME}"],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "node-facts", "mountPath": node_facts.ENV_DIR},
            {"name": "node-facts-script", "mountPath": node_facts.SCRIPT_DIR, "readOnly": True},
            {"name": "kube-api", "mountPath": node_facts.TOKEN_DIR, "readOnly": True},
        ],
    }


def _volumes(spec: ServeSpec, models: dict[str, Loading]) -> list[dict[str, Any]]:
    fuse = [loading.fuse_volume(spec)] if any(m.fuse for m in models.values()) else []
    return [
        {"name": "node-facts", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "node-facts-script", "configMap": {"name": f"{spec.name}-node-facts", "defaultMode": 0o444}},
        {
            "name": "kube-api",
            "projected": {
                "defaultMode": 0o444,
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}},
                    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                ],
            },
        },
        # On a TPU node the directory does not exist and is created empty: no nvidia-smi, the GPU container idles.
        {"name": "nvidia-driver", "hostPath": {"path": GPU_DRIVER_HOST_PATH, "type": "DirectoryOrCreate"}},
        *fuse,
    ]


def deployment(spec: ServeSpec, table: ServingTable | None = None) -> Manifest:
    table = table or load_table()
    models = loading.pod_loadings(spec, table)
    tolerations = [
        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": LABEL_CLASS, "operator": "Equal", "value": spec.name, "effect": "NoSchedule"},
    ]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(spec, spec.name),
        "spec": {
            "selector": {"matchLabels": selector_labels(spec)},
            "revisionHistoryLimit": 3,
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": labels(spec),
                    "annotations": {**annotations_for(spec), **loading.pod_annotations(models)},
                },
                "spec": {
                    "serviceAccountName": spec.name,
                    "automountServiceAccountToken": False,
                    "nodeSelector": {LABEL_CLASS: spec.name},
                    "affinity": _one_replica_per_node(spec),
                    "tolerations": tolerations,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                    "initContainers": [_init_container(spec)],
                    "containers": [_tpu_container(spec, table, models["tpu"]), _gpu_container(spec, models["gpu"])],
                    "volumes": _volumes(spec, models),
                },
            },
        },
    }


# ---------------------------------------------------------------------- all of it
def render_all(
    spec: ServeSpec,
    order: str = "tpu_first",
    table: ServingTable | None = None,
    *,
    scripts: Mapping[str, str] | None = None,
) -> list[Manifest]:
    """Every object, in apply order (the class and RBAC before the pods that need them).

    `scripts` (entrypoints.load_scripts()) ships the entrypoint scripts as a ConfigMap mounted into both
    vLLM containers; without it the images must carry them at entrypoints.ENTRYPOINT_DIR.
    """
    table = table or load_table()
    shipped = [] if scripts is None else [entrypoints.config_map(spec, scripts, metadata(spec, spec.name))]
    workload = deployment(spec, table) if scripts is None else entrypoints.mount(deployment(spec, table), spec)
    return [
        compute_class(spec, order, table),
        *node_reader(spec, table),
        *shipped,
        workload,
        service(spec),
        hpa(spec),
        pod_disruption_budget(spec),
        pod_monitoring(spec),
    ]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True  # no &anchors: each object reads (and applies) on its own


def to_yaml(objects: list[Manifest]) -> str:
    """Deterministic multi-document YAML (sorted keys, block style, no anchors)."""
    return yaml.dump_all(
        objects, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=120, explicit_start=True
    )


def object_refs(spec: ServeSpec) -> list[tuple[str, str, str | None, str]]:
    """(apiVersion, kind, namespace or None, name) of every object `render_all(..., scripts=...)` makes, in delete
    order (reverse of apply); deleting a missing one is a no-op."""
    reader = node_reader_name(spec)
    refs: list[tuple[str, str, str | None, str]] = [
        ("cloud.google.com/v1", "ComputeClass", None, spec.name),
        ("v1", "ServiceAccount", spec.namespace, spec.name),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", None, reader),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, reader),
        ("v1", "ConfigMap", spec.namespace, f"{spec.name}-node-facts"),
        ("v1", "ConfigMap", spec.namespace, f"{spec.name}-entrypoints"),
        ("apps/v1", "Deployment", spec.namespace, spec.name),
        ("v1", "Service", spec.namespace, spec.name),
        ("autoscaling/v2", "HorizontalPodAutoscaler", spec.namespace, spec.name),
        ("policy/v1", "PodDisruptionBudget", spec.namespace, spec.name),
        ("monitoring.googleapis.com/v1", "PodMonitoring", spec.namespace, spec.name),
    ]
    return refs[::-1]
