"""The serving compatibility table (``plugins/interlude/serving/serving_runtimes.yaml``), loaded once and typed.

Why typed: the spec, the runtime check and the renderer all ask the same questions (what topology does
v6e-8 have, which GKE accelerator name does it carry, which CUDA does this vLLM image ship); answering
them from one typed object keeps the three from disagreeing. The file is data with a public source per
row; this module only reads it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

# plugins/interlude/serving/tables.py -> <project>/include/serving_runtimes.yaml
DEFAULT_TABLE_PATH = Path(str(resources.files("interlude.serving") / "serving_runtimes.yaml"))  # package data
TABLE_ENV = "INTERLUDE_SERVING_RUNTIMES_YAML"


class ServingTableError(ValueError):
    """The serving table is missing or malformed."""


@dataclass(frozen=True)
class TpuShape:
    tpu_type: str  # Cloud TPU name, e.g. v6e-8
    generation: str  # v6e
    gke_accelerator: str  # tpu-v6e-slice
    chips: int  # google.com/tpu on one node
    topology: str  # 2x4
    machine_type: str
    source: str


@dataclass(frozen=True)
class TpuImageRow:
    recommended: tuple[str, ...]
    experimental: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class GpuType:
    name: str
    compute_capability: str
    min_cuda: str  # the first CUDA that builds for the compute capability
    counts: tuple[int, ...]
    min_driver: str | None = None  # NVIDIA's first driver that supports the GPU at all


@dataclass(frozen=True)
class ModelLoaders:
    """Which images can stream the export from gs:// (the Run:ai streamer), and the pages that say so."""

    streamer_min_version: Mapping[str, str]  # "gpu"/"tpu" -> first vLLM (TPU) release whose image streams gs://
    streamer_source: Mapping[str, str]
    gcsfuse_source: str


@dataclass(frozen=True)
class ServingTable:
    tpu_shapes: Mapping[str, TpuShape]
    tpu_repositories: tuple[str, ...]
    tpu_images: Mapping[str, TpuImageRow]
    gpu_repositories: tuple[str, ...]
    gpu_image_cuda: Mapping[str, tuple[str, str]]  # tag -> (cuda, source)
    min_compute_capability: str
    toolkit_min_driver: Mapping[str, str]
    driver_channels: Mapping[str, str]
    driver_channels_by_type: Mapping[str, Mapping[str, str]]  # gpu type -> channel -> driver GKE installs
    gpu_types: Mapping[str, GpuType]
    model_loaders: ModelLoaders

    def channel_driver(self, channel: str, gpu_type: str) -> str | None:
        """The driver GKE installs for `channel` on nodes of `gpu_type`: GKE picks per GPU type, so a GPU
        the channel's branch does not support (B200 on "default") gets its own row."""
        return self.driver_channels_by_type.get(gpu_type, {}).get(channel) or self.driver_channels.get(channel)

    def type_by_node_labels(self) -> dict[str, str]:
        """ "ACCELERATOR/TOPOLOGY" (the node's GKE labels) -> Cloud TPU type ("tpu-v6e-slice/2x4" -> "v6e-8")."""
        return {f"{s.gke_accelerator}/{s.topology}": s.tpu_type for s in self.tpu_shapes.values()}


def _shapes(tpu: Mapping[str, Any]) -> dict[str, TpuShape]:
    out: dict[str, TpuShape] = {}
    for generation, row in (tpu.get("generations") or {}).items():
        for tpu_type, shape in (row.get("shapes") or {}).items():
            out[str(tpu_type)] = TpuShape(
                tpu_type=str(tpu_type),
                generation=str(generation),
                gke_accelerator=str(row["gke_accelerator"]),
                chips=int(shape["chips"]),
                topology=str(shape["topology"]),
                machine_type=str(shape["machine_type"]),
                source=str(row["source"]),
            )
    return out


def _tpu_images(rows: Mapping[str, Any]) -> dict[str, TpuImageRow]:
    return {
        str(tag): TpuImageRow(
            tuple(map(str, row["recommended"])), tuple(map(str, row.get("experimental") or ())), str(row["source"])
        )
        for tag, row in rows.items()
    }


def _gpu_type(name: str, row: Mapping[str, Any]) -> GpuType:
    min_driver = row.get("min_driver")
    return GpuType(
        name,
        str(row["compute_capability"]),
        str(row["min_cuda"]),
        tuple(int(c) for c in row["counts"]),
        None if min_driver is None else str(min_driver),
    )


def _model_loaders(rows: Mapping[str, Any]) -> ModelLoaders:
    streamer = rows["runai_streamer"]
    return ModelLoaders(
        streamer_min_version={str(k): str(v) for k, v in streamer["min_version"].items()},
        streamer_source={str(k): str(v) for k, v in streamer["source"].items()},
        gcsfuse_source=str(rows["gcsfuse"]["source"]),
    )


def parse_table(data: Mapping[str, Any]) -> ServingTable:
    try:
        tpu_images = data["vllm_tpu_images"]
        gpu_images = data["vllm_gpu_images"]
        return ServingTable(
            tpu_shapes=_shapes(data["tpu"]),
            tpu_repositories=tuple(map(str, tpu_images["repositories"])),
            tpu_images=_tpu_images(tpu_images["tags"]),
            gpu_repositories=tuple(map(str, gpu_images["repositories"])),
            gpu_image_cuda={str(k): (str(v["cuda"]), str(v["source"])) for k, v in gpu_images["tags"].items()},
            min_compute_capability=str(gpu_images["min_compute_capability"]),
            toolkit_min_driver={str(k): str(v) for k, v in data["cuda"]["toolkit_min_driver"].items()},
            driver_channels={str(k): str(v) for k, v in data["gpu"]["driver_channels"].items()},
            driver_channels_by_type={
                str(t): {str(k): str(v) for k, v in row.items()}
                for t, row in (data["gpu"].get("driver_channels_by_type") or {}).items()
            },
            gpu_types={str(name): _gpu_type(str(name), row) for name, row in data["gpu"]["types"].items()},
            model_loaders=_model_loaders(data["model_loaders"]),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServingTableError(f"malformed serving table: {exc!r}") from exc


@functools.lru_cache(maxsize=4)
def _load(path: str) -> ServingTable:
    try:
        data = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # libyaml's
    except OSError as exc:
        raise ServingTableError(f"cannot read the serving table {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise ServingTableError(f"{path}: expected a mapping at the top level")
    return parse_table(data)


def load_table(path: str | os.PathLike[str] | None = None) -> ServingTable:
    """The table at `path`, else $INTERLUDE_SERVING_RUNTIMES_YAML, else the package's serving_runtimes.yaml."""
    chosen = path or os.environ.get(TABLE_ENV) or DEFAULT_TABLE_PATH
    return _load(str(chosen))
