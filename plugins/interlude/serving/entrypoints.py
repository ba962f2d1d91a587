"""Ship the two entrypoint scripts with the manifests, so the upstream vLLM images run unchanged.

The pod's containers run ``tpu_serve.sh`` / ``gpu_serve.sh`` (serve only when the node has the matching
accelerator, else idle; plugins/interlude/serving/entrypoint_scripts). The public recipe bakes such scripts into derived
images, which then have to be rebuilt for every vLLM release. Mounting them from a ConfigMap (read-only,
mode 0555) keeps `tpu_image` / `gpu_image` the upstream references the runtime table knows.
Without scripts the images must carry them at the same paths.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from interlude.serving.spec import ServeSpec

ENTRYPOINT_DIR = "/opt/interlude/entrypoints"
SCRIPT_NAMES = ("tpu_serve.sh", "gpu_serve.sh")
DEFAULT_SOURCE_DIR = Path(str(resources.files("interlude.serving") / "entrypoint_scripts"))  # package data
VOLUME = "entrypoints"


def load_scripts(directory: Path = DEFAULT_SOURCE_DIR) -> dict[str, str]:
    """The two scripts' text (data files read once by the caller; missing files raise FileNotFoundError)."""
    return {name: (directory / name).read_text() for name in SCRIPT_NAMES}


def config_map(spec: ServeSpec, scripts: Mapping[str, str], metadata: dict[str, Any]) -> dict[str, Any]:
    unknown = set(scripts) - set(SCRIPT_NAMES)
    if unknown or not scripts:
        raise ValueError(f"entrypoints: expected {', '.join(SCRIPT_NAMES)}, got {', '.join(sorted(scripts))}")
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**metadata, "name": f"{spec.name}-entrypoints"},
        "data": dict(sorted(scripts.items())),
    }


def mount(deployment: dict[str, Any], spec: ServeSpec) -> dict[str, Any]:
    """A copy of the Deployment with the scripts' ConfigMap mounted read-only into both vLLM containers."""
    out = copy.deepcopy(deployment)
    pod = out["spec"]["template"]["spec"]
    pod["volumes"].append({"name": VOLUME, "configMap": {"name": f"{spec.name}-entrypoints", "defaultMode": 0o555}})
    for container in pod["containers"]:
        container["volumeMounts"].append({"name": VOLUME, "mountPath": ENTRYPOINT_DIR, "readOnly": True})
    return out
