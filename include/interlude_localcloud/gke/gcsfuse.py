"""The Cloud Storage FUSE CSI driver of the local GKE: a ``csi`` volume of driver ``gcsfuse.csi.storage.gke.io``.

On GKE (https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-ephemeral) such a
volume mounts a bucket - or, with the ``only-dir`` mount option, one prefix of it - into the pod's containers,
through a sidecar GKE injects into pods annotated ``gke-gcsfuse/volumes: "true"``; without the annotation the
mount fails ("failed to find the sidecar container in Pod spec") and the pod never starts. Locally, with no FUSE
and no mount namespaces, the kubelet calls :func:`mount` for the volume's directory: the objects under the
prefix are copied there from the local cloud's Cloud Storage (the volume's read-only flag leaves the files
read-only), so a container reads the same files at its mountPath as it would on GKE.

Containers see their mountPaths as host directories (the kubelet rewrites paths in their command lines), so the
kubelet also tells each container, in :data:`MOUNTS_ENV`, which host directory stands for which mountPath:
a program that reports a path it was given (vLLM's ``/v1/models`` ``root``) can report the path the pod spec
named.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

DRIVER = "gcsfuse.csi.storage.gke.io"
ANNOTATION = "gke-gcsfuse/volumes"
MOUNTS_ENV = "INTERLUDE_VOLUME_MOUNTS"  # JSON {host directory: mountPath}


class MountError(RuntimeError):
    """The CSI driver could not mount the volume (the pod does not start)."""


def is_gcsfuse(volume: Mapping[str, Any]) -> bool:
    return (volume.get("csi") or {}).get("driver") == DRIVER


def _options(volume: Mapping[str, Any]) -> dict[str, str]:
    raw = str(((volume.get("csi") or {}).get("volumeAttributes") or {}).get("mountOptions") or "")
    out = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        key, _, value = item.partition("=")
        out[key] = value
    return out


def _client(endpoint: str | None) -> Any:
    """The local cloud's Cloud Storage (anonymous: the emulator takes no credentials)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    if not endpoint:
        raise MountError("no Cloud Storage endpoint for the FUSE volume (STORAGE_EMULATOR_HOST)")
    return storage.Client(
        project="local-project", credentials=AnonymousCredentials(), client_options={"api_endpoint": endpoint}
    )


def mount(directory: Path, volume: Mapping[str, Any], pod: Mapping[str, Any], endpoint: str | None) -> int:
    """Fill `directory` with the volume's objects from the Cloud Storage at `endpoint`; how many.

    Raises MountError as the driver refuses: no sidecar annotation, no bucketName, a bucket that is not there.
    """
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    name = volume.get("name")
    if annotations.get(ANNOTATION) != "true":
        raise MountError(
            f'MountVolume.SetUp failed for volume "{name}" : rpc error: code = FailedPrecondition desc = failed to '
            f'find the sidecar container in Pod spec (annotate the pod {ANNOTATION}: "true")'
        )
    attributes = (volume.get("csi") or {}).get("volumeAttributes") or {}
    bucket = attributes.get("bucketName")
    if not bucket:
        raise MountError(f'MountVolume.SetUp failed for volume "{name}" : bucketName is required')
    only_dir = _options(volume).get("only-dir", "").strip("/")
    prefix = f"{only_dir}/" if only_dir else ""
    from google.api_core.exceptions import NotFound

    client = _client(endpoint)
    try:
        blobs = [b for b in client.list_blobs(bucket, prefix=prefix) if not b.name.endswith("/")]
    except NotFound as exc:
        raise MountError(f'MountVolume.SetUp failed for volume "{name}" : bucket {bucket} not found') from exc
    read_only = bool((volume.get("csi") or {}).get("readOnly"))
    for blob in blobs:
        target = directory / blob.name[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(target))
        if read_only:
            target.chmod(0o444)
    return len(blobs)


def mounts_env(container: Mapping[str, Any], host_dirs: Mapping[str, str]) -> dict[str, str]:
    """:data:`MOUNTS_ENV` for a container: its volumes' host directories -> the mountPaths its spec names."""
    pairs = {
        host_dirs[m["name"]]: m["mountPath"] for m in container.get("volumeMounts") or [] if m["name"] in host_dirs
    }
    return {MOUNTS_ENV: json.dumps(pairs, sort_keys=True)} if pairs else {}
