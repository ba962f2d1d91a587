"""The compatibility table (``plugins/interlude/runtimes/runtimes.yaml``) as typed objects, loaded once.

The facts are data so they move with Google and the frameworks without a code change; this module only
parses them and refuses a malformed file at load, before a validation could trip over it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

# Package data beside this module (any install); INTERLUDE_RUNTIMES_YAML points elsewhere.
DEFAULT_TABLE_PATH = Path(str(resources.files("interlude.runtimes") / "runtimes.yaml"))
TABLE_ENV = "INTERLUDE_RUNTIMES_YAML"


class RuntimeTableError(ValueError):
    """The compatibility table file is missing or malformed."""


def version_or_none(text: str | None) -> Version | None:
    return None if text in (None, "") else Version(str(text))


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class FrameworkRange:
    """Versions of one framework that work, possibly tightened per GPU architecture.

    ``note`` is a caveat shown as a warning whenever the framework is checked on that hardware.
    """

    name: str
    min: str | None = None
    max: str | None = None
    python_min: str | None = None
    python_min_from: str | None = None  # the framework version from which python_min applies (None = all)
    min_by_architecture: Mapping[str, str] = field(default_factory=dict)
    min_cuda_by_architecture: Mapping[str, str] = field(default_factory=dict)
    min_compute_capability: str | None = None
    note: str | None = None
    source: str | None = None

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any] | None) -> FrameworkRange:
        data = data or {}
        return cls(
            name=name,
            min=_str(data.get("min")),
            max=_str(data.get("max")),
            python_min=_str(data.get("python_min")),
            python_min_from=_str(data.get("python_min_from")),
            min_by_architecture={k: str(v) for k, v in (data.get("min_by_architecture") or {}).items()},
            min_cuda_by_architecture={k: str(v) for k, v in (data.get("min_cuda_by_architecture") or {}).items()},
            min_compute_capability=_str(data.get("min_compute_capability")),
            note=_str(data.get("note")),
            source=_str(data.get("source")),
        )


@dataclass(frozen=True)
class TensorflowRules:
    """How the ``tpu-vm-tf-*`` names a generation takes are formed.

    ``device_apis``: the ``-pjrt``/``-se`` endings it takes from ``device_api_from`` on; ``hardware``: the
    hardware suffixes that include it; ``own_suffix``/``own_until``: a suffix only this generation uses, for
    TF releases up to a version (TPU v4: ``-v4`` up to 2.10.0).
    """

    device_apis: tuple[str, ...]
    hardware: tuple[str, ...]
    recommended_version: str
    min_version: str | None = None
    own_suffix: str | None = None
    own_until: str | None = None


@dataclass(frozen=True)
class TpuGeneration:
    key: str
    label: str
    source: str
    prefix: str
    count_unit: str
    single_host_max: int
    multi_host_per_host: int
    recommended_runtime: str
    runtimes: tuple[str, ...]
    legacy_runtimes: tuple[str, ...]
    tensorflow: TensorflowRules
    frameworks: Mapping[str, FrameworkRange]
    sizes: tuple[int, ...] = ()  # published sizes (the N of PREFIX-N); empty = any
    sizes_every: tuple[int, int] | None = None  # (step, max): also every multiple of step up to max

    def published_size(self, size: int) -> bool:
        """Whether Google publishes a slice of this size (v6e-12 and v5litepod-2 do not exist)."""
        if not self.sizes and self.sizes_every is None:
            return True
        if size in self.sizes:
            return True
        return self.sizes_every is not None and size % self.sizes_every[0] == 0 and 0 < size <= self.sizes_every[1]

    def describe_sizes(self) -> str:
        shown = ", ".join(f"{self.prefix}{n}" for n in self.sizes)
        if self.sizes_every is not None:
            step, top = self.sizes_every
            shown += f", then every {step} {self.count_unit} up to {self.prefix}{top}"
        return shown


@dataclass(frozen=True)
class GpuType:
    name: str
    label: str
    source: str
    architecture: str
    compute_capability: str
    machine_types: tuple[str, ...]
    min_driver: int
    min_cuda: str
    recommended_image: str


@dataclass(frozen=True)
class TensorflowReleases:
    """Google's published TensorFlow runtime names: version -> name endings (each also with ``-pod``).

    ``endings`` is built by Google's rule (:func:`tf_endings`): ``-pjrt``/``-se`` from ``device_api_from``,
    no ending before, plus the hardware-suffixed exceptions (``-v4`` up to 2.10.0, zone-listed builds).
    """

    source: str
    device_api_from: str
    endings: Mapping[str, tuple[str, ...]]

    def names(self) -> tuple[str, ...]:
        out: list[str] = []
        for version, endings in self.endings.items():
            for ending in endings:
                tail = f"-{ending}" if ending else ""
                out += [f"tpu-vm-tf-{version}{tail}", f"tpu-vm-tf-{version}-pod{tail}"]
        return tuple(out)


@dataclass(frozen=True)
class RuntimeTable:
    """The parsed ``runtimes.yaml``."""

    tpu_generations: Mapping[str, TpuGeneration]
    tpu_aliases: Mapping[str, str]
    tpu_not_served: Mapping[str, str]
    system_python: str
    tensorflow: TensorflowReleases
    gpu_types: Mapping[str, GpuType]
    gpu_aliases: Mapping[str, str]
    gpu_tpu_only_frameworks: Mapping[str, str]
    cuda_min_driver: Mapping[str, int]
    gpu_frameworks: Mapping[str, FrameworkRange]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RuntimeTable:
        try:
            tpu, gpu = data["tpu"], data["gpu"]
            table = cls(
                tpu_generations={key: _generation(key, g) for key, g in tpu["generations"].items()},
                tpu_aliases=dict(tpu.get("aliases") or {}),
                tpu_not_served=dict(tpu.get("not_served") or {}),
                system_python=str(tpu["system_python"]),
                tensorflow=TensorflowReleases(
                    source=str(tpu["tensorflow"]["source"]),
                    device_api_from=str(tpu["tensorflow"]["device_api_from"]),
                    endings=tf_endings(tpu["tensorflow"]),
                ),
                gpu_types={name: _gpu_type(name, t) for name, t in gpu["types"].items()},
                gpu_aliases=dict(gpu.get("aliases") or {}),
                gpu_tpu_only_frameworks=dict(gpu.get("tpu_only_frameworks") or {}),
                cuda_min_driver={str(k): int(v) for k, v in gpu["cuda_min_driver"].items()},
                gpu_frameworks={n: FrameworkRange.from_mapping(n, r) for n, r in gpu["frameworks"].items()},
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise RuntimeTableError(f"malformed runtime table: {type(exc).__name__}: {exc}") from exc
        _check_table_versions(table)
        return table

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RuntimeTable:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise RuntimeTableError(f"cannot read runtime table {path}: {exc}") from exc
        # libyaml's parser when PyYAML has it (the same data, ~9x less CPU: a task process loads this table)
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        if not isinstance(data, Mapping):
            raise RuntimeTableError(f"runtime table {path} is not a mapping")
        return cls.from_mapping(data)

    @property
    def tpu_frameworks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for g in self.tpu_generations.values() for n in g.frameworks))


def tf_endings(tf: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """TF version -> name endings, by Google's rule: every listed release takes ``-pjrt`` and ``-se`` from
    ``device_api_from`` on and no ending before; the hardware-suffixed exceptions are added on top."""
    since = Version(str(tf["device_api_from"]))
    out: dict[str, list[str]] = {}
    for version in tf["releases"]:
        out[str(version)] = ["pjrt", "se"] if Version(str(version)) >= since else [""]
    for extra in ("hardware_names", "zone_names"):
        for version, ends in ((tf.get(extra) or {}).get("endings") or {}).items():
            out.setdefault(str(version), []).extend(str(e) for e in ends)
    return {v: tuple(ends) for v, ends in out.items()}


def _sizes_every(g: Mapping[str, Any]) -> tuple[int, int] | None:
    every = g.get("sizes_every")
    return None if every is None else (int(every["step"]), int(every["max"]))


def _generation(key: str, g: Mapping[str, Any]) -> TpuGeneration:
    tf = g["tensorflow"]
    own = tf.get("own_names_until") or {}
    return TpuGeneration(
        key=key,
        label=str(g["label"]),
        source=str(g["source"]),
        prefix=str(g["prefix"]),
        count_unit=str(g["count_unit"]),
        single_host_max=int(g["single_host_max"]),
        multi_host_per_host=int(g["multi_host_per_host"]),
        recommended_runtime=str(g["recommended_runtime"]),
        runtimes=tuple(g["runtimes"]),
        legacy_runtimes=tuple(g.get("legacy_runtimes") or ()),
        tensorflow=TensorflowRules(
            device_apis=tuple(str(v) for v in tf["device_apis"]),
            hardware=tuple(str(v) for v in tf["hardware"]),
            recommended_version=str(tf["recommended_version"]),
            min_version=_str(tf.get("min_version")),
            own_suffix=_str(own.get("suffix")),
            own_until=_str(own.get("version")),
        ),
        frameworks={n: FrameworkRange.from_mapping(n, r) for n, r in g["frameworks"].items()},
        sizes=tuple(int(n) for n in g.get("sizes") or ()),
        sizes_every=_sizes_every(g),
    )


def _gpu_type(name: str, t: Mapping[str, Any]) -> GpuType:
    return GpuType(
        name=name,
        label=str(t["label"]),
        source=str(t["source"]),
        architecture=str(t["architecture"]),
        compute_capability=str(t["compute_capability"]),
        machine_types=tuple(t.get("machine_types") or ()),
        min_driver=int(t["min_driver"]),
        min_cuda=str(t["min_cuda"]),
        recommended_image=str(t["recommended_image"]),
    )


def _check_versions(where: str, name: str, versions: list[str | None]) -> None:
    for v in versions:
        try:
            version_or_none(v)
        except InvalidVersion as exc:
            raise RuntimeTableError(f"runtime table ({where}, {name}): bad version {v!r}") from exc


def _range_versions(rng: FrameworkRange) -> list[str | None]:
    return [
        rng.min,
        rng.max,
        rng.python_min,
        rng.python_min_from,
        *rng.min_by_architecture.values(),
        *rng.min_cuda_by_architecture.values(),
    ]


def _check_table_versions(table: RuntimeTable) -> None:
    """Every version in the table must parse, or validation would crash later."""
    for gen in table.tpu_generations.values():
        for rng in gen.frameworks.values():
            _check_versions(gen.key, rng.name, _range_versions(rng))
        tf = gen.tensorflow
        _check_versions(gen.key, "tensorflow runtimes", [tf.recommended_version, tf.min_version, tf.own_until])
    for rng in table.gpu_frameworks.values():
        _check_versions("gpu", rng.name, _range_versions(rng))
    _check_versions("tpu", "tensorflow releases", [table.tensorflow.device_api_from, *table.tensorflow.endings])


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> RuntimeTable:
    return RuntimeTable.load(path)


def default_table() -> RuntimeTable:
    """The table at ``$INTERLUDE_RUNTIMES_YAML`` or ``plugins/interlude/runtimes/runtimes.yaml`` (loaded once)."""
    return _load_cached(os.environ.get(TABLE_ENV) or str(DEFAULT_TABLE_PATH))
