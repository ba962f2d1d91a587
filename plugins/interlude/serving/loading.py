"""How each vLLM container reads the model export from Cloud Storage: the way Google documents for its image.

The export is a Hugging Face model directory in Cloud Storage (``config.json``, ``*.safetensors``, tokenizer
files). A vLLM image reads it in one of two ways GKE documents (``serving_runtimes.yaml``, ``model_loaders``):

- ``runai_streamer``: ``vllm serve gs://BUCKET/DIR --load-format=runai_streamer``; the image's Run:ai Model
  Streamer reads the bucket with Application Default Credentials, which on GKE are the pod's Kubernetes
  ServiceAccount through Workload Identity Federation. Only images with the streamer's GCS backend can
  (vLLM GPU 0.11.1+, vLLM TPU 0.18.0+).
- ``gcsfuse``: a Cloud Storage FUSE CSI ephemeral volume mounts the export's prefix read-only at
  ``FUSE_MOUNT`` (pod annotation ``gke-gcsfuse/volumes: "true"``, driver ``gcsfuse.csi.storage.gke.io``) and
  vLLM serves that local directory. Any image can.

``model_loader=auto`` picks the streamer where the image has it and the FUSE volume otherwise, per container:
the pod's TPU and GPU images may differ (the default GPU image, vLLM 0.11.0, ships CUDA 12.8 for the L4's
R570 driver but no GCS streamer). An explicit ``runai_streamer`` on an image without it is refused by the
runtime check, naming the param, before anything is applied.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from interlude.serving.images import ImageRef, parse_image
from interlude.serving.spec import GS_URI_RE, ServeSpec
from interlude.serving.tables import ServingTable

KINDS = ("tpu", "gpu")
FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"
FUSE_VOLUME = "model-export"
FUSE_MOUNT = "/models/export"
ANNOTATION_FUSE = "gke-gcsfuse/volumes"  # GKE injects the FUSE sidecar into pods that carry it
ANNOTATION_GSA = "iam.gke.io/gcp-service-account"  # the KSA acts as this Google service account
_RELEASE = re.compile(r"^v?(?P<version>[0-9]+(?:\.[0-9]+){1,2})(?:$|[-+])")


@dataclass(frozen=True)
class Loading:
    """One container's way to the export: the loader, the model argument vLLM gets, and its extra flags."""

    kind: str  # "tpu" or "gpu"
    loader: str  # "runai_streamer" or "gcsfuse"
    model: str  # the positional model of `vllm serve` (gs:// URI or the FUSE mount path)
    flags: tuple[str, ...]
    source: str  # the page that documents this loader for this image

    @property
    def fuse(self) -> bool:
        return self.loader == "gcsfuse"


def image_release(image: ImageRef) -> Version | None:
    """The vLLM (TPU) release a tag names (v0.18.0, v0.28.0-cu129), or None (a nightly's commit, a digest only)."""
    match = _RELEASE.match(image.tag or "")
    if match is None:
        return None
    try:
        return Version(match.group("version"))
    except InvalidVersion:  # pragma: no cover - the regex only lets versions through
        return None


def streams_gcs(image: ImageRef, kind: str, table: ServingTable) -> bool:
    """Does this vLLM image read gs:// with the Run:ai streamer (serving_runtimes.yaml, model_loaders)?"""
    release = image_release(image)
    return release is not None and release >= Version(table.model_loaders.streamer_min_version[kind])


def _image(spec: ServeSpec, kind: str) -> ImageRef:
    return parse_image(f"{kind}_image", spec.tpu_image if kind == "tpu" else spec.gpu_image)


def loader_for(spec: ServeSpec, kind: str, table: ServingTable) -> str:
    """The loader the `kind` container uses: the param, or for auto the streamer where the image has it."""
    if spec.model_loader != "auto":
        return spec.model_loader
    return "runai_streamer" if streams_gcs(_image(spec, kind), kind, table) else "gcsfuse"


def loading(spec: ServeSpec, kind: str, table: ServingTable) -> Loading:
    """The `kind` container's model argument and flags. The spec must carry an export URI."""
    assert spec.checkpoint_uri is not None
    loader = loader_for(spec, kind, table)
    if loader == "gcsfuse":
        return Loading(kind, loader, FUSE_MOUNT, (), table.model_loaders.gcsfuse_source)
    # Kubernetes expands $(VAR) in args; $$ keeps a literal $ (an object name may contain one).
    uri = spec.checkpoint_uri.rstrip("/").replace("$", "$$")
    return Loading(kind, loader, uri, ("--load-format=runai_streamer",), table.model_loaders.streamer_source[kind])


def pod_loadings(spec: ServeSpec, table: ServingTable) -> dict[str, Loading]:
    return {kind: loading(spec, kind, table) for kind in KINDS}


def fuse_volume(spec: ServeSpec) -> dict[str, Any]:
    """The CSI ephemeral volume: the export's prefix of its bucket, read-only
    (https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-ephemeral)."""
    assert spec.checkpoint_uri is not None
    match = GS_URI_RE.match(spec.checkpoint_uri)
    assert match is not None  # ServeSpec.check refused anything else
    prefix = match.group("path").strip("/")
    return {
        "name": FUSE_VOLUME,
        "csi": {
            "driver": FUSE_DRIVER,
            "readOnly": True,
            # only-dir: mount the export's prefix, not the bucket; implicit-dirs: the export is written
            # without folder placeholder objects (https://cloud.google.com/storage/docs/cloud-storage-fuse/cli-options).
            "volumeAttributes": {
                "bucketName": match.group("bucket"),
                "mountOptions": f"implicit-dirs,only-dir={prefix}",
            },
        },
    }


def fuse_mount() -> dict[str, Any]:
    return {"name": FUSE_VOLUME, "mountPath": FUSE_MOUNT, "readOnly": True}


def pod_annotations(loadings: dict[str, Loading]) -> dict[str, str]:
    """The FUSE sidecar's opt-in: without it the CSI driver refuses to mount the volume."""
    return {ANNOTATION_FUSE: "true"} if any(item.fuse for item in loadings.values()) else {}


def service_account_annotations(spec: ServeSpec) -> dict[str, str]:
    """Workload Identity: the pods' KSA acts as `gcp_service_account` (which needs roles/iam.workloadIdentityUser
    for this KSA and read access to the bucket); without it, IAM grants the KSA's own principal directly
    (https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity)."""
    return {ANNOTATION_GSA: spec.gcp_service_account} if spec.gcp_service_account else {}


def served_roots(spec: ServeSpec, table: ServingTable) -> set[str]:
    """What vLLM's /v1/models reports as `root` (the model it was given) for either container."""
    return {item.model.replace("$$", "$") for item in pod_loadings(spec, table).values()}
