"""How requests reach the replicas and how their number follows the queue: Service, HPA, PodMonitoring.

One port (8000) for the pod whichever container serves (see render.py); Managed Service for Prometheus
scrapes vLLM's /metrics, and the HPA averages vLLM's waiting requests per pod through the Custom Metrics
Stackdriver Adapter (https://cloud.google.com/kubernetes-engine/docs/tutorials/serve-vllm-tpu#autoscale).
"""

from __future__ import annotations

from interlude.serving.meta import Manifest, metadata, selector_labels
from interlude.serving.spec import ServeSpec

PORT = 8000


def quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers as such, fractions in milli-units (0.5 -> 500m)."""
    return str(int(value)) if float(value).is_integer() else f"{round(value * 1000)}m"


def service(spec: ServeSpec) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.name),
        "spec": {
            "type": spec.service_type,
            "selector": selector_labels(spec),
            "ports": [{"name": "http", "port": PORT, "targetPort": PORT, "protocol": "TCP"}],
        },
    }


def hpa(spec: ServeSpec) -> Manifest:
    """Scale on vLLM's waiting requests per pod; up fast, down slowly (a replica costs minutes to start)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(spec, spec.name),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.name},
            "minReplicas": spec.replicas_min,
            "maxReplicas": spec.replicas_max,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": spec.hpa_metric},
                        "target": {"type": "AverageValue", "averageValue": quantity(spec.hpa_target_waiting)},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "selectPolicy": "Max",
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }


def pod_disruption_budget(spec: ServeSpec) -> Manifest:
    """Voluntary evictions (GKE's active migration, node drains, Interlude's maintenance step) never take the
    last Ready replica: a replica leaves only while another one answers, so serving keeps answering
    (https://kubernetes.io/docs/tasks/run-application/configure-pdb/). Interlude's maintenance step surges a
    replacement before it evicts, which is what makes its own eviction allowed. The price: a lone replica on
    GPU is not moved back to TPU by active migration alone; a surge (one more replica) lets it move."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(spec, spec.name),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": selector_labels(spec)}},
    }


def pod_monitoring(spec: ServeSpec) -> Manifest:
    """Managed Prometheus scrapes vLLM's /metrics (https://cloud.google.com/stackdriver/docs/managed-prometheus/setup-managed)."""
    return {
        "apiVersion": "monitoring.googleapis.com/v1",
        "kind": "PodMonitoring",
        "metadata": metadata(spec, spec.name),
        "spec": {
            "selector": {"matchLabels": selector_labels(spec)},
            "endpoints": [{"port": PORT, "path": "/metrics", "interval": "15s"}],
        },
    }
