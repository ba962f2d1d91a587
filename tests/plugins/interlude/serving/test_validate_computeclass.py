"""ComputeClass validation against GKE's own CRD (plugins/interlude/serving/schemas/computeclass.schema.json).

Google's published ComputeClasses (the reference page's example, a TPU and a GPU class from Google's
accelerated-platforms repository, copied into data/ with their URLs) must pass; each CEL rule of the CRD
must refuse what the API server refuses, naming the field; and the fields GKE accepts must be accepted.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from interlude.serving.validate import CEL_CHECKS, SCHEMA_DIR, TRANSITION_RULES, problems

DATA = Path(__file__).parent / "data"
GOOGLE = sorted(DATA.glob("computeclass-*.yaml"))


class _KubectlLoader(yaml.SafeLoader):
    """YAML as kubectl reads it: sigs.k8s.io/yaml turns `2024-10-10T00:00:00Z` into a JSON string, not a date."""


_KubectlLoader.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _load(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(path.read_text(), Loader=_KubectlLoader)
    return loaded


def _class(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "cloud.google.com/v1", "kind": "ComputeClass", "metadata": {"name": "c"}, "spec": spec}


def _one(rule: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return _class({"priorities": [rule], **spec})


AUTOPILOT = {"autopilot": {"enabled": True}, "nodePoolAutoCreation": {"enabled": True}}
KUBELET = "nodeSystemConfig"


def test_the_google_manifests_are_all_here() -> None:
    assert [p.name for p in GOOGLE] == [
        "computeclass-gpu-h100-80gb-high-x4.yaml",
        "computeclass-reference-priority-defaults.yaml",
        "computeclass-reference.yaml",
        "computeclass-tpu-v6e-2x4.yaml",
    ]


@pytest.mark.parametrize("path", GOOGLE, ids=lambda p: p.stem)
def test_googles_published_compute_classes_validate(path: Path) -> None:
    manifest = _load(path)
    assert manifest["kind"] == "ComputeClass" and manifest["spec"]["priorities"]
    assert problems(manifest) == []


# (case, manifest the API server refuses, the field names the refusal must carry)
REFUSED: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    (
        "family-and-type",
        _one({"machineFamily": "n4", "machineType": "n4-standard-8"}),
        ("machineFamily", "machineType"),
    ),
    ("type-and-min-cores", _one({"machineType": "n4-standard-8", "minCores": 4}), ("machineType", "minCores")),
    ("type-and-min-memory", _one({"machineType": "n4-standard-8", "minMemoryGb": 4}), ("machineType", "minMemoryGb")),
    ("nodepools-and-spot", _one({"nodepools": ["a"], "spot": True}), ("nodepools",)),
    ("flex-start-and-spot", _one({"flexStart": {"enabled": True}, "spot": True}), ("flexStart.enabled", "spot")),
    (
        "capacity-wait-on-gpu",
        _one({"gpu": {"type": "nvidia-l4", "count": 1}, "capacityCheckWaitTimeSeconds": 60}),
        ("capacityCheckWaitTimeSeconds",),
    ),
    ("family-ek", _one({"machineFamily": "ek"}), ("machineFamily",)),
    ("type-ek", _one({"machineType": "ek-standard-8"}), ("machineType",)),
    ("family-e4a", _one({"machineFamily": "e4a"}), ("machineFamily",)),
    ("type-e4a", _one({"machineType": "e4a-standard-2"}), ("machineType",)),
    ("network-profile", _one({"acceleratorNetworkProfile": "manual"}), ("acceleratorNetworkProfile",)),
    ("specific-without-list", _one({"reservations": {"affinity": "Specific"}}), ("reservations.specific",)),
    (
        "list-without-specific",
        _one({"reservations": {"affinity": "AnyBestEffort", "specific": [{"name": "r"}]}}),
        ("reservations.affinity",),
    ),
    (
        "score-on-some",
        _class({"priorities": [{"spot": True, "priorityScore": 10}, {"spot": False}]}),
        ("priorityScore",),
    ),
    ("autopilot-nodepools", _one({"nodepools": ["a"]}, **AUTOPILOT), ("autopilot", "nodepools")),
    # the CRD defaults nodePoolAutoCreation to {enabled: false} before its CEL rules run
    (
        "autopilot-defaulted-no-autocreation",
        _one({"machineFamily": "n4"}, autopilot={"enabled": True}),
        ("nodePoolAutoCreation.enabled",),
    ),
    (
        "autopilot-ubuntu",
        _one({"machineFamily": "n4"}, nodePoolConfig={"imageType": "ubuntu_containerd"}, **AUTOPILOT),
        ("nodePoolConfig.imageType",),
    ),
    (
        "autopilot-logging",
        _one(
            {"machineFamily": "n4"},
            **AUTOPILOT,
            nodePoolConfig={"loggingConfig": {"loggingVariantConfig": {"variant": "MAX_THROUGHPUT"}}},
        ),
        ("loggingVariantConfig.variant",),
    ),
    ("pod-family-in-standard", _one({"podFamily": "general-purpose"}), ("podFamily",)),
    (
        "throughput-without-group",
        _one({"machineFamily": "n4"}, nodePoolConfig={"workloadType": "HIGH_THROUGHPUT"}),
        (
            "nodePoolGroup",
            "workloadType",
        ),
    ),
    (
        "confidential-needs-machine",
        _one(
            {"gpu": {"type": "nvidia-h100-80gb", "count": 1}},
            nodePoolConfig={"confidentialNodeType": "CONFIDENTIAL_INSTANCE_TYPE_UNSPECIFIED"},
        ),
        ("confidentialNodeType", "machineFamily"),
    ),
    (
        "sev-on-n2",
        _one({"machineFamily": "n2"}, nodePoolConfig={"confidentialNodeType": "SEV"}),
        ("confidentialNodeType",),
    ),
    (
        "sev-snp-on-c3d",
        _one({"machineType": "c3d-standard-4"}, nodePoolConfig={"confidentialNodeType": "SEV_SNP"}),
        ("confidentialNodeType",),
    ),
    (
        "tdx-on-n2",
        _one({"machineFamily": "n2"}, nodePoolConfig={"confidentialNodeType": "TDX"}),
        ("confidentialNodeType",),
    ),
    (
        "tdx-c3-with-l4",
        _one(
            {"machineType": "c3-standard-8", "gpu": {"type": "nvidia-l4"}},
            nodePoolConfig={"confidentialNodeType": "TDX"},
        ),
        ("gpu.type",),
    ),
    (
        "tdx-c4-with-l4",
        _one({"machineFamily": "c4", "gpu": {"type": "nvidia-l4"}}, nodePoolConfig={"confidentialNodeType": "TDX"}),
        ("gpu.type",),
    ),
    (
        "tdx-a3-with-l4",
        _one(
            {"machineType": "a3-highgpu-1g", "gpu": {"type": "nvidia-l4", "count": 1}},
            nodePoolConfig={"confidentialNodeType": "TDX"},
        ),
        ("gpu.type",),
    ),
    (
        "tdx-a4-with-h100",
        _one(
            {"machineFamily": "a4", "gpu": {"type": "nvidia-h100-80gb", "count": 8}},
            nodePoolConfig={"confidentialNodeType": "TDX"},
        ),
        ("gpu.type",),
    ),
    (
        "gc-low-above-high",
        _one({KUBELET: {"kubeletConfig": {"imageGcHighThresholdPercent": 70, "imageGcLowThresholdPercent": 75}}}),
        ("imageGcLowThresholdPercent", "imageGcHighThresholdPercent"),
    ),
    (
        "gc-high-under-default-low",
        _class({"priorityDefaults": {KUBELET: {"kubeletConfig": {"imageGcHighThresholdPercent": 80}}}}),
        ("imageGcHighThresholdPercent",),
    ),
    (
        "two-swap-profiles",
        _one(
            {
                KUBELET: {
                    "linuxNodeConfig": {
                        "swapConfig": {
                            "bootDiskProfile": {"swapSizeGib": 4},
                            "dedicatedLocalSsdProfile": {"diskCount": 1},
                        }
                    }
                }
            }
        ),
        ("bootDiskProfile", "dedicatedLocalSsdProfile"),
    ),
    (
        "swap-size-twice",
        _one(
            {
                KUBELET: {
                    "linuxNodeConfig": {
                        "swapConfig": {"ephemeralLocalSsdProfile": {"swapSizeGib": 4, "swapSizePercent": 10}}
                    }
                }
            }
        ),
        ("swapSizeGib", "swapSizePercent"),
    ),
]


@pytest.mark.parametrize(("manifest", "fields"), [(m, f) for _, m, f in REFUSED], ids=[c for c, _, _ in REFUSED])
def test_each_cel_rule_refuses_naming_the_field(manifest: dict[str, Any], fields: tuple[str, ...]) -> None:
    found = problems(manifest)
    assert len(found) == 1, found
    assert found[0].startswith("ComputeClass/c: spec"), found
    for field in fields:
        assert field in found[0], (field, found[0])


def test_every_cel_rule_of_the_crd_has_a_refusing_case() -> None:
    """Read the rules from the schema file itself: each one is enforced and each one is exercised above."""
    in_schema: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            in_schema.update(r["message"] for r in node.get("x-kubernetes-validations", []))
            for value in node.values():
                walk(value)

    walk(json.loads((SCHEMA_DIR / "computeclass.schema.json").read_text()))
    assert in_schema - TRANSITION_RULES == set(CEL_CHECKS)
    refused = {problem.rsplit(": ", 1)[1] for _, manifest, _ in REFUSED for problem in problems(manifest)}
    assert refused == set(CEL_CHECKS)


# (case, manifest GKE accepts: the other side of each rule, and fields the old schema refused)
ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    ("empty-spec-defaults", _class({})),
    ("tpu-without-topology", _one({"tpu": {"type": "tpu-v6e-slice", "count": 4}})),
    ("capacity-wait-on-tpu", _one({"tpu": {"type": "tpu-v6e-slice", "count": 4}, "capacityCheckWaitTimeSeconds": 600})),
    ("capacity-wait-on-flex", _one({"flexStart": {"enabled": True}, "capacityCheckWaitTimeSeconds": 600})),
    ("flex-start-on-demand", _one({"flexStart": {"enabled": True}, "spot": False})),
    (
        "score-on-all",
        _class({"priorities": [{"spot": True, "priorityScore": 10}, {"spot": False, "priorityScore": 5}]}),
    ),
    ("network-profile-auto", _one({"acceleratorNetworkProfile": "auto-custom"})),
    (
        "tdx-a3-with-h100",
        _one(
            {"machineType": "a3-highgpu-1g", "gpu": {"type": "nvidia-h100-80gb", "count": 1}},
            nodePoolConfig={"confidentialNodeType": "TDX"},
        ),
    ),
    ("gc-high-alone-above-80", _one({KUBELET: {"kubeletConfig": {"imageGcHighThresholdPercent": 85}}})),
    (
        "everything-the-old-schema-lacked",
        _class(
            {
                **AUTOPILOT,
                "nodePoolGroup": {"name": "group-a"},
                "buffers": {"limits": {"cpu": "10", "memory": "20Gi"}},
                "priorityDefaults": {"location": {"zones": ["us-east5-b"], "locationPolicy": "BALANCED"}},
                "activeMigration": {"optimizeRulePriority": True, "ensureAllDaemonSetPodsRunning": True},
                "nodePoolConfig": {
                    "nodeLabels": {"team": "ml"},
                    "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
                },
                "priorities": [
                    {
                        "tpu": {"type": "tpu-v6e-slice", "count": 4, "topology": "2x2"},
                        "capacityCheckWaitTimeSeconds": 600,
                        "priorityScore": 100,
                        "spot": False,
                        "maxPodsPerNode": 32,
                        "nodeLabels": {"tier": "tpu"},
                        "taints": [{"key": "tpu", "effect": "NoSchedule"}],
                        "storage": {"bootDiskSize": 100, "bootDiskType": "hyperdisk-balanced"},
                    },
                    {
                        "gpu": {
                            "type": "nvidia-l4",
                            "count": 1,
                            "gpuSharing": {"sharingStrategy": "TIME_SHARING", "maxSharedClientsPerGPU": 2},
                        },
                        "machineFamily": "g2",
                        "minCores": 8,
                        "minMemoryGb": 32,
                        "priorityScore": 50,
                        "location": {"locationPolicy": "ANY", "zones": ["us-central1-a"]},
                        "reservations": {"affinity": "None"},
                    },
                    {"podFamily": "general-purpose", "priorityScore": 10},
                ],
            }
        ),
    ),
]


@pytest.mark.parametrize("manifest", [m for _, m in ACCEPTED], ids=[c for c, _ in ACCEPTED])
def test_what_gke_accepts_validates(manifest: dict[str, Any]) -> None:
    assert problems(manifest) == []


@pytest.mark.parametrize(
    ("patch", "where"),
    [
        ({"whenUnsatisfiable": "Maybe"}, "spec/whenUnsatisfiable"),
        ({"priorities": [{"machinetype": "n4-standard-8"}]}, "spec/priorities/0"),  # a typo: unknown field
        ({"priorities": [{}]}, "spec/priorities/0"),  # a priority must say something
        ({"priorities": [{"maxPodsPerNode": 4}]}, "spec/priorities/0/maxPodsPerNode"),
        ({"priorities": [{"priorityScore": 0}]}, "spec/priorities/0/priorityScore"),
        ({"priorities": [{"tpu": {"type": "tpu-v6e-slice", "count": "eight"}}]}, "spec/priorities/0/tpu/count"),
        ({"buffers": {"limits": {"cpu": "lots"}}}, "spec/buffers/limits/cpu"),
        ({"autopilot": {"enabled": "yes"}}, "spec/autopilot/enabled"),
    ],
)
def test_the_structural_schema_refuses_naming_the_path(patch: dict[str, Any], where: str) -> None:
    found = problems(_class(patch))
    assert found and all(p.startswith(f"ComputeClass/c: {where}") for p in found), found


def test_status_is_ignored_and_defaults_do_not_leak_into_the_input() -> None:
    manifest = _load(DATA / "computeclass-reference.yaml")
    before = copy.deepcopy(manifest)
    manifest["status"] = {"anything": ["the API server drops status on create"]}
    assert problems(manifest) == []
    del manifest["status"]
    before.pop("status")
    assert manifest == before  # validation filled its defaults into a copy
