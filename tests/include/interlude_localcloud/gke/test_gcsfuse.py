"""The local GKE's Cloud Storage FUSE CSI volume: the export's prefix copied read-only into the volume, refused as
the driver refuses (no sidecar annotation), and the mountPath a container's spec named, told to the container."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from interlude_localcloud.gke import gcsfuse
from interlude_workload.gcs import storage_client

POD = {"metadata": {"annotations": {"gke-gcsfuse/volumes": "true"}}}


def _volume(bucket: str, options: str = "implicit-dirs,only-dir=models/export-1") -> dict[str, object]:
    return {
        "name": "model-export",
        "csi": {
            "driver": "gcsfuse.csi.storage.gke.io",
            "readOnly": True,
            "volumeAttributes": {"bucketName": bucket, "mountOptions": options},
        },
    }


def test_the_prefix_is_mounted_read_only(bucket: str, tmp_path: Path) -> None:
    b = storage_client().bucket(bucket)
    for name, data in {"config.json": b"{}", "model.safetensors": b"w", "sub/x.txt": b"x"}.items():
        b.blob(f"models/export-1/{name}").upload_from_string(data)
    b.blob("models/export-10/config.json").upload_from_string(b"other")  # a sibling prefix stays out
    assert gcsfuse.is_gcsfuse(_volume(bucket)) and not gcsfuse.is_gcsfuse({"emptyDir": {}})
    count = gcsfuse.mount(tmp_path, _volume(bucket), POD, os.environ["STORAGE_EMULATOR_HOST"])
    assert count == 3
    files = {str(p.relative_to(tmp_path)): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert files == {"config.json": b"{}", "model.safetensors": b"w", "sub/x.txt": b"x"}
    assert not (tmp_path / "config.json").stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


def test_without_the_sidecar_annotation_the_mount_fails(bucket: str, tmp_path: Path) -> None:
    with pytest.raises(gcsfuse.MountError, match="failed to find the sidecar container"):
        gcsfuse.mount(tmp_path, _volume(bucket), {"metadata": {}}, os.environ["STORAGE_EMULATOR_HOST"])
    with pytest.raises(gcsfuse.MountError, match="bucket no-such-bucket-x not found"):
        gcsfuse.mount(tmp_path, _volume("no-such-bucket-x"), POD, os.environ["STORAGE_EMULATOR_HOST"])


def test_a_container_is_told_which_host_directory_is_which_mount_path() -> None:
    container = {
        "volumeMounts": [{"name": "model-export", "mountPath": "/models/export"}, {"name": "x", "mountPath": "/x"}]
    }
    env = gcsfuse.mounts_env(container, {"model-export": "/tmp/pod/volumes/model-export"})
    assert json.loads(env[gcsfuse.MOUNTS_ENV]) == {"/tmp/pod/volumes/model-export": "/models/export"}
    assert gcsfuse.mounts_env({"volumeMounts": []}, {"model-export": "/d"}) == {}
