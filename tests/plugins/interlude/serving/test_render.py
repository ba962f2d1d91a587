"""Rendered manifests: golden files, determinism, Kubernetes 1.33 + custom-resource schemas, design choices.

Regenerate the golden files after an intended change with INTERLUDE_UPDATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from interlude.serving import entrypoints, meta, node_facts, render
from interlude.serving.spec import ServeSpec
from interlude.serving.tables import load_table
from interlude.serving.validate import problems, validate_all

GOLDEN = Path(__file__).parent / "golden"
CKPT = "gs://interlude-local/interlude/run-1/finetune/step-00000030/"
SPECS: dict[str, tuple[ServeSpec, str]] = {
    "default": (ServeSpec(checkpoint_uri=CKPT), "tpu_first"),
    "default-gpu-first": (ServeSpec(checkpoint_uri=CKPT), "gpu_first"),
    "v5e8-a100-nodepools-lb": (
        ServeSpec(
            checkpoint_uri=CKPT,
            name="llm",
            namespace="serving",
            tpu_type="v5litepod-8",
            gpu_type="nvidia-a100-80gb",
            gpu_count=2,
            tpu_nodepools=("v5e-pool",),
            gpu_nodepools=("a100",),
            service_type="LoadBalancer",
            replicas_min=2,
            replicas_max=8,
            hpa_target_waiting=0.5,
            gcp_service_account="vllm-reader@my-project.iam.gserviceaccount.com",
        ),
        "tpu_first",
    ),
}


SCRIPTS = {"tpu_serve.sh": '#!/usr/bin/env bash\necho tpu "$@"\n', "gpu_serve.sh": "#!/usr/bin/env bash\necho gpu\n"}


def _by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


@pytest.mark.parametrize("case", [*sorted(SPECS), "default-with-scripts"])
def test_golden(case: str) -> None:
    spec, order = SPECS[case.removesuffix("-with-scripts")]
    scripts = SCRIPTS if case.endswith("-with-scripts") else None
    text = render.to_yaml(render.render_all(spec, order, scripts=scripts))
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("INTERLUDE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{path} differs; rerun with INTERLUDE_UPDATE_GOLDEN=1 if intended"


@pytest.mark.parametrize("case", sorted(SPECS))
def test_every_object_passes_kubernetes_and_the_schemas(case: str) -> None:
    spec, order = SPECS[case]
    objects = render.render_all(spec, order)
    assert validate_all(objects) == []
    assert [o["kind"] for o in objects] == [
        "ComputeClass",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "PodMonitoring",
    ]


def test_the_validators_are_not_vacuous() -> None:
    objects = _by_kind(render.render_all(SPECS["default"][0]))
    broken = [
        (objects["Deployment"], ("spec", "template", "spec", "containers", 0), "privilegd", True),
        (objects["Service"], ("spec",), "ports", "8000"),
        (objects["HorizontalPodAutoscaler"], ("spec",), "minReplicas", "one"),
        (
            objects["ComputeClass"],
            ("spec", "priorities", 0, "tpu"),
            "count",
            "eight",
        ),  # the CRD: tpu.type is any string
        (objects["ComputeClass"], ("spec", "priorities", 0), "capacityCheckWaitTimeSeconds", 0),
        (objects["ComputeClass"], ("spec", "priorities", 1), "spot", "yes"),
        (objects["ComputeClass"], ("spec",), "whenUnsatisfiable", "Maybe"),
        (objects["PodMonitoring"], ("spec", "endpoints", 0), "interval", "soon"),
    ]
    for obj, path, key, value in broken:
        copy = yaml.safe_load(yaml.safe_dump(obj))
        target: Any = copy
        for part in path:
            target = target[part]
        target[key] = value
        assert problems(copy), (obj["kind"], key)


def test_same_spec_same_bytes_and_yaml_round_trip() -> None:
    spec = SPECS["v5e8-a100-nodepools-lb"][0]
    first = render.to_yaml(render.render_all(spec))
    assert first == render.to_yaml(render.render_all(ServeSpec.from_json(spec.to_json())))
    assert list(yaml.safe_load_all(first)) == render.render_all(spec)


@pytest.mark.parametrize("tpu_type", sorted(load_table().tpu_shapes))
def test_compute_class_tpu_first_then_gpu_for_every_shape(tpu_type: str) -> None:
    spec = ServeSpec(checkpoint_uri=CKPT, tpu_type=tpu_type)
    shape = load_table().tpu_shapes[tpu_type]
    cc = render.compute_class(spec)
    assert cc["spec"]["priorities"] == [
        {"tpu": {"type": shape.gke_accelerator, "count": shape.chips, "topology": shape.topology}, "spot": False},
        {"gpu": {"type": "nvidia-l4", "count": 1, "driverVersion": "latest"}},
    ]
    assert cc["spec"]["activeMigration"] == {"optimizeRulePriority": True}
    assert cc["spec"]["whenUnsatisfiable"] == "DoNotScaleUp"
    assert problems(cc) == []


def test_gpu_first_reverses_priorities_and_stops_active_migration() -> None:
    spec = SPECS["default"][0]
    tpu_first, gpu_first = render.compute_class(spec, "tpu_first"), render.compute_class(spec, "gpu_first")
    assert gpu_first["spec"]["priorities"] == tpu_first["spec"]["priorities"][::-1]
    assert gpu_first["spec"]["activeMigration"] == {"optimizeRulePriority": False}
    assert gpu_first["metadata"]["annotations"][render.ANNOTATION_ORDER] == "gpu_first"
    with pytest.raises(ValueError, match="order: 'sideways'"):
        render.compute_class(spec, "sideways")


def test_the_pod_fits_both_node_kinds_and_asks_for_no_accelerator() -> None:
    pod = _by_kind(render.render_all(SPECS["default"][0]))["Deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/compute-class": "interlude-vllm"}
    assert {t["key"] for t in pod["tolerations"]} == {
        "google.com/tpu",
        "nvidia.com/gpu",
        "cloud.google.com/compute-class",
    }
    for container in pod["containers"] + pod["initContainers"]:
        wanted = {**container["resources"].get("requests", {}), **container["resources"].get("limits", {})}
        assert not {"google.com/tpu", "nvidia.com/gpu"} & set(wanted), container["name"]
    assert [c["name"] for c in pod["containers"]] == ["vllm-tpu", "vllm-gpu"]


def test_one_port_and_health_probes_on_both_containers() -> None:
    objects = _by_kind(render.render_all(SPECS["default"][0]))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    for container in pod["containers"]:
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"] == {"path": "/health", "port": 8000}, container["name"]
        assert "--port=8000" in container["args"]
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] == 8000
    assert objects["PodMonitoring"]["spec"]["endpoints"] == [{"port": 8000, "path": "/metrics", "interval": "15s"}]


def test_privilege_is_confined_to_the_two_vllm_containers() -> None:
    objects = _by_kind(render.render_all(SPECS["default"][0]))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    init = pod["initContainers"][0]["securityContext"]
    assert init["runAsNonRoot"] and init["readOnlyRootFilesystem"] and not init["allowPrivilegeEscalation"]
    assert init["capabilities"] == {"drop": ["ALL"]}
    gpu = pod["containers"][1]
    assert gpu["volumeMounts"] == [  # the driver and (vLLM 0.11.0 has no GCS streamer) the export, both read-only
        {"name": "nvidia-driver", "mountPath": "/usr/local/nvidia", "readOnly": True},
        {"name": "model-export", "mountPath": "/models/export", "readOnly": True},
    ]
    assert objects["ClusterRole"]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    assert objects["ServiceAccount"]["automountServiceAccountToken"] is False


def test_params_reach_containers_as_argv_never_inside_the_shell_script() -> None:
    spec = ServeSpec.from_params({"checkpoint_uri": "gs://interlude-local/a/$(NODE_IP)/b;c'd"})
    tpu = _by_kind(render.render_all(spec))["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert tpu["command"][:2] == ["/bin/sh", "-c"] and tpu["command"][2] == node_facts.SOURCE_AND_EXEC
    assert "gs://interlude-local/a/$$(NODE_IP)/b;c'd" in tpu["args"]  # Kubernetes turns $$ back into $


def test_labels_and_annotations_carry_the_checkpoint_and_the_digest() -> None:
    spec = SPECS["default"][0]
    for obj in render.render_all(spec):
        assert obj["metadata"]["labels"]["interlude_dev.wiring/spec-digest"] == spec.digest()[:16]
        assert obj["metadata"]["annotations"][meta.ANNOTATION_CHECKPOINT] == CKPT
    template = _by_kind(render.render_all(spec))["Deployment"]["spec"]["template"]["metadata"]
    assert template["annotations"][meta.ANNOTATION_DIGEST] == spec.digest()
    deployment = _by_kind(render.render_all(spec))["Deployment"]
    assert "replicas" not in deployment["spec"]  # the HPA owns the replica count


def test_hpa_scales_on_waiting_requests() -> None:
    hpa = _by_kind(render.render_all(SPECS["v5e8-a100-nodepools-lb"][0]))["HorizontalPodAutoscaler"]["spec"]
    assert hpa["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "prometheus.googleapis.com|vllm:num_requests_waiting|gauge"},
                "target": {"type": "AverageValue", "averageValue": "500m"},
            },
        }
    ]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 8)
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_object_refs_name_every_rendered_object_in_delete_order() -> None:
    spec = SPECS["v5e8-a100-nodepools-lb"][0]
    rendered = [
        (o["apiVersion"], o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        for o in render.render_all(spec, scripts=SCRIPTS)
    ]
    assert render.object_refs(spec) == rendered[::-1]
    assert render.object_refs(ServeSpec(action="delete", name="llm", namespace="serving")) == rendered[::-1]


def test_shipped_entrypoints_are_mounted_read_only_into_both_vllm_containers() -> None:
    objects = render.render_all(SPECS["default"][0], scripts=SCRIPTS)
    assert validate_all(objects) == []
    config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
    assert config_maps["interlude-vllm-entrypoints"]["data"] == SCRIPTS
    pod = _by_kind(objects)["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "entrypoints", "configMap": {"name": "interlude-vllm-entrypoints", "defaultMode": 0o555}} in pod[
        "volumes"
    ]
    for container in pod["containers"]:
        assert {"name": "entrypoints", "mountPath": "/opt/interlude/entrypoints", "readOnly": True} in container[
            "volumeMounts"
        ]
    assert "entrypoints" not in str(pod["initContainers"])
    without = _by_kind(render.render_all(SPECS["default"][0]))["Deployment"]
    assert "entrypoints" not in str(without["spec"]["template"]["spec"]["volumes"])  # the input was not mutated
    with pytest.raises(ValueError, match="entrypoints: expected"):
        render.render_all(SPECS["default"][0], scripts={"serve.sh": "x"})


def test_the_project_entrypoints_ship() -> None:
    scripts = (
        entrypoints.load_scripts()
    )  # plugins/interlude/serving/entrypoint_scripts: a missing script raises, never skips
    assert set(scripts) == set(entrypoints.SCRIPT_NAMES) and all(s.startswith("#!") for s in scripts.values())
    assert validate_all(render.render_all(SPECS["default"][0], scripts=scripts)) == []
