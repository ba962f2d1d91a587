"""Accelerator software compatibility: which TPU runtime / GPU image fits which hardware and framework.

A wrong TPU runtime fails the launch or quietly runs slowly; a GPU image with too old a driver or CUDA
does not run the workload at all. Both cost a provisioning round trip and an hour of someone's time, so
the pipeline checks before it provisions. The facts live in ``include/runtimes.yaml`` (data, edited
when Google or a framework moves); this module loads them and explains every mismatch with what would
work instead.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from interlude.capacity import AcceleratorKind, kind_of

# plugins/interlude/runtimes.py -> <project>/include/runtimes.yaml (editable install and an Airflow
# project folder alike); INTERLUDE_RUNTIMES_YAML points elsewhere.
DEFAULT_TABLE_PATH = Path(__file__).resolve().parents[2] / "include" / "runtimes.yaml"
TABLE_ENV = "INTERLUDE_RUNTIMES_YAML"

_TF_RUNTIME = re.compile(r"^tpu-vm-tf-(?P<version>\d+\.\d+\.\d+)(?P<pod>-pod)?(?:-(?P<variant>pjrt|se))?$")
_IMAGE_CUDA = re.compile(r"(?:^|[-_])cu(?P<major>1\d)(?P<minor>\d)(?:$|[-_])")
_IMAGE_DRIVER = re.compile(r"nvidia-(?P<driver>\d{3})(?:$|[-_])")


class RuntimeTableError(ValueError):
    """The compatibility table file is missing or malformed."""


class UnknownAcceleratorError(ValueError):
    """An accelerator type the table does not know."""


class UnknownFrameworkError(ValueError):
    """A framework name the table does not know for that accelerator family."""


def _v(text: str | None) -> Version | None:
    return None if text in (None, "") else Version(str(text))


@dataclass(frozen=True)
class FrameworkRange:
    """Versions of one framework that work, possibly tightened per GPU architecture."""

    name: str
    min: str | None = None
    max: str | None = None
    python_min: str | None = None
    min_by_architecture: Mapping[str, str] = field(default_factory=dict)
    min_cuda_by_architecture: Mapping[str, str] = field(default_factory=dict)
    min_compute_capability: str | None = None

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any] | None) -> FrameworkRange:
        data = data or {}
        return cls(
            name=name,
            min=_str(data.get("min")),
            max=_str(data.get("max")),
            python_min=_str(data.get("python_min")),
            min_by_architecture={k: str(v) for k, v in (data.get("min_by_architecture") or {}).items()},
            min_cuda_by_architecture={
                k: str(v) for k, v in (data.get("min_cuda_by_architecture") or {}).items()
            },
            min_compute_capability=_str(data.get("min_compute_capability")),
        )


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class TensorflowRuntimes:
    """Which ``tpu-vm-tf-X.Y.Z[-pod][-pjrt|-se]`` runtimes a generation takes."""

    variants: tuple[str, ...]
    min_version: str
    recommended_version: str


@dataclass(frozen=True)
class TpuGeneration:
    key: str
    label: str
    prefix: str
    count_unit: str
    per_host: int
    recommended_runtime: str
    runtimes: tuple[str, ...]
    legacy_runtimes: tuple[str, ...]
    tensorflow: TensorflowRuntimes
    frameworks: Mapping[str, FrameworkRange]


@dataclass(frozen=True)
class GpuType:
    name: str
    label: str
    architecture: str
    compute_capability: str
    machine_types: tuple[str, ...]
    min_driver: int
    min_cuda: str
    recommended_image: str


@dataclass(frozen=True)
class RuntimeTable:
    """The parsed ``runtimes.yaml``."""

    tpu_generations: Mapping[str, TpuGeneration]
    tpu_aliases: Mapping[str, str]
    tpu_not_served: Mapping[str, str]
    system_python: str
    gpu_types: Mapping[str, GpuType]
    gpu_aliases: Mapping[str, str]
    gpu_tpu_only_frameworks: Mapping[str, str]
    cuda_min_driver: Mapping[str, int]
    gpu_frameworks: Mapping[str, FrameworkRange]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RuntimeTable:
        try:
            tpu, gpu = data["tpu"], data["gpu"]
            gens = {}
            for key, g in tpu["generations"].items():
                tf = g["tensorflow"]
                gens[key] = TpuGeneration(
                    key=key,
                    label=str(g["label"]),
                    prefix=str(g["prefix"]),
                    count_unit=str(g["count_unit"]),
                    per_host=int(g["per_host"]),
                    recommended_runtime=str(g["recommended_runtime"]),
                    runtimes=tuple(g["runtimes"]),
                    legacy_runtimes=tuple(g.get("legacy_runtimes") or ()),
                    tensorflow=TensorflowRuntimes(
                        variants=tuple(str(v) for v in tf["variants"]),
                        min_version=str(tf["min_version"]),
                        recommended_version=str(tf["recommended_version"]),
                    ),
                    frameworks={n: FrameworkRange.from_mapping(n, r) for n, r in g["frameworks"].items()},
                )
            types = {
                name: GpuType(
                    name=name,
                    label=str(t["label"]),
                    architecture=str(t["architecture"]),
                    compute_capability=str(t["compute_capability"]),
                    machine_types=tuple(t.get("machine_types") or ()),
                    min_driver=int(t["min_driver"]),
                    min_cuda=str(t["min_cuda"]),
                    recommended_image=str(t["recommended_image"]),
                )
                for name, t in gpu["types"].items()
            }
            table = cls(
                tpu_generations=gens,
                tpu_aliases=dict(tpu.get("aliases") or {}),
                tpu_not_served=dict(tpu.get("not_served") or {}),
                system_python=str(tpu["system_python"]),
                gpu_types=types,
                gpu_aliases=dict(gpu.get("aliases") or {}),
                gpu_tpu_only_frameworks=dict(gpu.get("tpu_only_frameworks") or {}),
                cuda_min_driver={str(k): int(v) for k, v in gpu["cuda_min_driver"].items()},
                gpu_frameworks={n: FrameworkRange.from_mapping(n, r) for n, r in gpu["frameworks"].items()},
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise RuntimeTableError(f"malformed runtime table: {type(exc).__name__}: {exc}") from exc
        for gen in gens.values():  # every version in the table must parse, or validation would crash later
            for rng in gen.frameworks.values():
                _check_versions(rng, gen.key)
        for rng in table.gpu_frameworks.values():
            _check_versions(rng, "gpu")
        return table

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RuntimeTable:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise RuntimeTableError(f"cannot read runtime table {path}: {exc}") from exc
        data = yaml.safe_load(text)
        if not isinstance(data, Mapping):
            raise RuntimeTableError(f"runtime table {path} is not a mapping")
        return cls.from_mapping(data)

    @property
    def tpu_frameworks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for g in self.tpu_generations.values() for n in g.frameworks))


def _check_versions(rng: FrameworkRange, where: str) -> None:
    for v in (
        rng.min,
        rng.max,
        rng.python_min,
        *rng.min_by_architecture.values(),
        *rng.min_cuda_by_architecture.values(),
    ):
        try:
            _v(v)
        except InvalidVersion as exc:
            raise RuntimeTableError(f"runtime table ({where}, {rng.name}): bad version {v!r}") from exc


@functools.lru_cache(maxsize=4)
def _load_cached(path: str) -> RuntimeTable:
    return RuntimeTable.load(path)


def default_table() -> RuntimeTable:
    """The table at ``$INTERLUDE_RUNTIMES_YAML`` or ``include/runtimes.yaml`` (loaded once)."""
    return _load_cached(os.environ.get(TABLE_ENV) or str(DEFAULT_TABLE_PATH))


@dataclass(frozen=True)
class TpuType:
    """A parsed TPU accelerator type such as ``v5litepod-16``."""

    accelerator_type: str
    generation: TpuGeneration
    size: int

    @property
    def hosts(self) -> int:
        return max(1, -(-self.size // self.generation.per_host))

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    def describe(self) -> str:
        return f"{self.accelerator_type} ({self.generation.label})"


def parse_tpu_type(accelerator_type: str, table: RuntimeTable | None = None) -> TpuType:
    """``v6e-8`` -> generation v6e, 8 chips. Raises :class:`UnknownAcceleratorError` with a hint."""
    table = table or default_table()
    name = accelerator_type.strip()
    for prefix, hint in table.tpu_not_served.items():
        if name.startswith(prefix):
            raise UnknownAcceleratorError(f"{name!r}: {hint}")
    for gen in sorted(table.tpu_generations.values(), key=lambda g: -len(g.prefix)):
        if name.startswith(gen.prefix):
            rest = name[len(gen.prefix) :]
            if not rest.isdigit() or int(rest) < 1:
                raise UnknownAcceleratorError(
                    f"{name!r}: {gen.label} types are {gen.prefix}N with N the number of {gen.count_unit}"
                )
            return TpuType(accelerator_type=name, generation=gen, size=int(rest))
    known = ", ".join(f"{g.prefix}N ({g.label})" for g in table.tpu_generations.values())
    raise UnknownAcceleratorError(f"unknown TPU accelerator type {name!r}; known: {known}")


def gpu_type(accelerator_type: str, table: RuntimeTable | None = None) -> GpuType:
    table = table or default_table()
    try:
        return table.gpu_types[accelerator_type]
    except KeyError:
        raise UnknownAcceleratorError(
            f"unknown GPU type {accelerator_type!r}; known: {', '.join(table.gpu_types)}"
        ) from None


def _tf_runtime(tpu: TpuType, version: str | None = None) -> str:
    tf = tpu.generation.tensorflow
    chosen = tf.recommended_version
    try:
        if version and Version(version) >= Version(tf.min_version):
            chosen = str(Version(version).base_version)
            if chosen.count(".") == 1:
                chosen += ".0"
    except InvalidVersion:
        pass
    variant = "pjrt" if "pjrt" in tf.variants else tf.variants[0]
    return f"tpu-vm-tf-{chosen}{'-pod' if tpu.multi_host else ''}{'-' + variant if variant else ''}"


def recommended_runtime(
    accelerator_type: str,
    framework: str | None = None,
    framework_version: str | None = None,
    table: RuntimeTable | None = None,
) -> str:
    """The TPU runtime version to use (TensorFlow gets its own ``tpu-vm-tf-*`` runtime)."""
    table = table or default_table()
    tpu = parse_tpu_type(accelerator_type, table)
    if framework and table.tpu_aliases.get(framework, framework) == "tensorflow":
        return _tf_runtime(tpu, framework_version)
    return tpu.generation.recommended_runtime


def recommended_gpu_image(accelerator_type: str, table: RuntimeTable | None = None) -> str:
    """The Deep Learning VM image family to boot a GPU VM of that type with."""
    return gpu_type(accelerator_type, table).recommended_image


@dataclass(frozen=True)
class RuntimeCheck:
    """Outcome of :func:`validate`: ``ok`` is True when ``problems`` is empty."""

    ok: bool
    accelerator_type: str
    kind: AcceleratorKind | None
    runtime: str | None
    framework: str | None = None
    framework_version: str | None = None
    hardware: str | None = None
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()

    def message(self) -> str:
        hardware = f" ({self.hardware})" if self.hardware else ""
        framework = ""
        if self.framework:
            framework = f", {self.framework}" + (
                f" {self.framework_version}" if self.framework_version else ""
            )
        head = (
            f"{'OK' if self.ok else 'NOT OK'}: {self.accelerator_type}{hardware} with "
            f"{self.runtime or '(no runtime)'}{framework}"
        )
        lines = [head]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [f"  instead: {s}" for s in self.suggestions]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "accelerator_type": self.accelerator_type,
            "kind": self.kind.value if self.kind else None,
            "runtime": self.runtime,
            "framework": self.framework,
            "framework_version": self.framework_version,
            "hardware": self.hardware,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "suggestions": list(self.suggestions),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RuntimeCheck:
        return cls(
            ok=bool(data["ok"]),
            accelerator_type=str(data["accelerator_type"]),
            kind=AcceleratorKind(data["kind"]) if data.get("kind") else None,
            runtime=data.get("runtime"),
            framework=data.get("framework"),
            framework_version=data.get("framework_version"),
            hardware=data.get("hardware"),
            problems=tuple(data.get("problems", ())),
            warnings=tuple(data.get("warnings", ())),
            suggestions=tuple(data.get("suggestions", ())),
        )


@dataclass
class _Findings:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suggestions: list[str] = field(default_factory=list)

    def problem(self, text: str, instead: str | None = None) -> None:
        self.problems.append(text)
        if instead:
            self.suggestions.append(instead)

    def warn(self, text: str, instead: str | None = None) -> None:
        self.warnings.append(text)
        if instead:
            self.suggestions.append(instead)

    def check(
        self,
        accelerator_type: str,
        kind: AcceleratorKind | None,
        runtime: str | None,
        framework: str | None,
        framework_version: str | None,
        hardware: str | None,
    ) -> RuntimeCheck:
        return RuntimeCheck(
            ok=not self.problems,
            accelerator_type=accelerator_type,
            kind=kind,
            runtime=runtime,
            framework=framework,
            framework_version=framework_version,
            hardware=hardware,
            problems=tuple(self.problems),
            warnings=tuple(self.warnings),
            suggestions=tuple(dict.fromkeys(self.suggestions)),
        )


def validate(
    accelerator_type: str,
    runtime: str | None = "",
    framework: str | None = "",
    framework_version: str | None = None,
    offered_runtime_versions: Sequence[str] | None = None,
    *,
    python_version: str | None = None,
    table: RuntimeTable | None = None,
) -> RuntimeCheck:
    """Check that ``runtime`` (TPU runtime version, or GPU image family; blank = the recommended one)
    and ``framework`` at ``framework_version`` fit ``accelerator_type``.

    ``offered_runtime_versions`` is what the zone offers (``TpuHook.list_runtime_versions``, or image
    families for GPUs); None skips that check. ``python_version`` is the interpreter the workload uses
    (None = the runtime's system Python). Never raises for unknown names: they are problems.
    """
    table = table or default_table()
    accelerator_type = (accelerator_type or "").strip()
    runtime = (runtime or "").strip()
    framework = (framework or "").strip().lower() or None
    framework_version = (framework_version or "").strip() or None
    if not accelerator_type:
        found = _Findings()
        found.problem(
            "no accelerator type given", "pass a TPU type such as v6e-8 or a GPU type such as nvidia-l4"
        )
        return found.check("", None, runtime or None, framework, framework_version, None)
    if kind_of(accelerator_type) == AcceleratorKind.GPU:
        return _validate_gpu(
            table,
            accelerator_type,
            runtime,
            framework,
            framework_version,
            offered_runtime_versions,
            python_version,
        )
    return _validate_tpu(
        table,
        accelerator_type,
        runtime,
        framework,
        framework_version,
        offered_runtime_versions,
        python_version,
    )


def _version_problems(
    found: _Findings, rng: FrameworkRange, version: str | None, where: str, architecture: str | None = None
) -> None:
    if version is None:
        return
    try:
        have = Version(version)
    except InvalidVersion:
        found.problem(
            f"{rng.name} version {version!r} is not a version number", f"pass e.g. {rng.min or '1.0'}"
        )
        return
    floor = _v(rng.min)
    arch_floor = _v(rng.min_by_architecture.get(architecture or ""))
    if arch_floor is not None and (floor is None or arch_floor > floor):
        floor = arch_floor
    if floor is not None and have < floor:
        found.problem(
            f"{rng.name} {version} is older than {where} needs (>= {floor})", f"use {rng.name} >= {floor}"
        )
    ceiling = _v(rng.max)
    if ceiling is not None and have > ceiling:
        found.problem(
            f"{rng.name} {version} is newer than {where} supports (<= {ceiling})",
            f"use {rng.name} <= {ceiling}",
        )


def _python_problems(
    found: _Findings, rng: FrameworkRange, python_version: str | None, system_python: str | None
) -> None:
    need = _v(rng.python_min)
    if need is None:
        return
    if python_version is None:
        if system_python is not None and Version(system_python) < need:
            found.warn(
                f"{rng.name} needs Python >= {need}; the runtime's system Python is {system_python}",
                f"install Python >= {need} on the machine (e.g. `uv python install {need}`) or run "
                f"{rng.name} in its container image",
            )
        return
    try:
        have = Version(python_version)
    except InvalidVersion:
        found.problem(f"Python version {python_version!r} is not a version number")
        return
    if have < need:
        found.problem(f"{rng.name} needs Python >= {need}, not {python_version}", f"use Python >= {need}")


def _runtime_generations(table: RuntimeTable, runtime: str) -> list[TpuGeneration]:
    return [
        g for g in table.tpu_generations.values() if runtime in g.runtimes or runtime in g.legacy_runtimes
    ]


def _tf_runtime_fits(tpu: TpuType, runtime: str) -> tuple[bool, str]:
    """Whether a ``tpu-vm-tf-*`` runtime fits the generation; (fits, why-not)."""
    m = _TF_RUNTIME.match(runtime)
    if m is None:
        return False, "not a tpu-vm-tf-X.Y.Z[-pod][-pjrt|-se] name"
    tf = tpu.generation.tensorflow
    variant = m.group("variant") or ""
    if variant not in tf.variants:
        shown = ", ".join(f"-{v}" if v else "(none)" for v in tf.variants)
        return (
            False,
            f"variant {'-' + variant if variant else '(none)'} is not used on {tpu.generation.label} "
            f"(use {shown})",
        )
    if Version(m.group("version")) < Version(tf.min_version):
        return (
            False,
            f"TensorFlow {m.group('version')} predates {tpu.generation.label} (needs >= {tf.min_version})",
        )
    if tpu.multi_host and not m.group("pod"):
        return False, f"{tpu.accelerator_type} spans {tpu.hosts} hosts and needs a -pod runtime"
    return True, ""


def _compatible(table: RuntimeTable, tpu: TpuType, runtime: str, framework: str | None) -> bool:
    if _TF_RUNTIME.match(runtime):
        return _tf_runtime_fits(tpu, runtime)[0] and framework in (None, "tensorflow")
    if framework == "tensorflow":
        return False
    return runtime in tpu.generation.runtimes


def _validate_tpu(
    table: RuntimeTable,
    accelerator_type: str,
    runtime: str,
    framework: str | None,
    framework_version: str | None,
    offered: Sequence[str] | None,
    python_version: str | None,
) -> RuntimeCheck:
    found = _Findings()
    try:
        tpu = parse_tpu_type(accelerator_type, table)
    except UnknownAcceleratorError as exc:
        found.problem(
            str(exc), "use one of: " + ", ".join(f"{g.prefix}8" for g in table.tpu_generations.values())
        )
        return found.check(
            accelerator_type, AcceleratorKind.TPU, runtime or None, framework, framework_version, None
        )
    gen = tpu.generation
    hardware = gen.label

    if framework is not None:
        aliased = table.tpu_aliases.get(framework, framework)
        if aliased != framework:
            found.warn(f"framework {framework!r} on TPU means {aliased!r}")
            framework = aliased
        if framework not in table.tpu_frameworks:
            found.problem(
                f"unknown framework {framework!r} for TPU; known: {', '.join(table.tpu_frameworks)}",
                "pick one of: " + ", ".join(table.tpu_frameworks),
            )
            framework = None
        elif framework not in gen.frameworks:
            where = [g for g in table.tpu_generations.values() if framework in g.frameworks]
            found.problem(
                f"{framework} does not run on {tpu.describe()}; it runs on "
                + ", ".join(g.label for g in where),
                "use a " + " or ".join(f"{g.prefix}N" for g in where) + f" type for {framework}",
            )
        else:
            rng = gen.frameworks[framework]
            _version_problems(found, rng, framework_version, gen.label)
            _python_problems(found, rng, python_version, table.system_python)

    if not runtime:
        chosen = recommended_runtime(accelerator_type, framework, framework_version, table)
        if offered is not None and chosen not in offered:
            alternatives = [r for r in offered if _compatible(table, tpu, r, framework)]
            if alternatives:
                found.warn(
                    f"recommended runtime {chosen} is not offered in this zone; using {alternatives[0]}"
                )
                chosen = alternatives[0]
            else:
                found.problem(
                    f"runtime {chosen} for {tpu.describe()} is not offered in this zone "
                    f"(offered: {', '.join(offered) or 'none'})",
                    "try another zone",
                )
        return found.check(
            accelerator_type, AcceleratorKind.TPU, chosen, framework, framework_version, hardware
        )

    recommended = recommended_runtime(accelerator_type, framework, framework_version, table)
    tf_match = _TF_RUNTIME.match(runtime)
    if tf_match:
        fits, why = _tf_runtime_fits(tpu, runtime)
        if not fits:
            found.problem(
                f"runtime {runtime} does not run on {tpu.describe()}: {why}",
                f"use {_tf_runtime(tpu, tf_match.group('version'))}",
            )
        if framework == "tensorflow" and framework_version is not None:
            try:
                same = Version(framework_version) == Version(tf_match.group("version"))
            except InvalidVersion:
                same = True  # already reported as a bad version
            if not same:
                found.problem(
                    f"runtime {runtime} ships TensorFlow {tf_match.group('version')}, "
                    f"not {framework_version}",
                    f"use {_tf_runtime(tpu, framework_version)}",
                )
        elif framework not in (None, "tensorflow"):
            found.warn(
                f"runtime {runtime} is a TensorFlow runtime; {framework} is better served by "
                f"{gen.recommended_runtime}",
                f"use {gen.recommended_runtime}",
            )
    elif runtime in gen.runtimes:
        pass
    elif runtime in gen.legacy_runtimes:
        found.warn(
            f"runtime {runtime} is a legacy runtime for {gen.label}", f"prefer {gen.recommended_runtime}"
        )
    elif others := _runtime_generations(table, runtime):
        found.problem(
            f"runtime {runtime} does not run on {tpu.describe()}; use {recommended} ({runtime} is "
            f"for {', '.join(g.label for g in others)})",
            f"use {recommended}",
        )
    elif _IMAGE_CUDA.search(runtime) or runtime.startswith(("common-", "pytorch-", "tf-")):
        found.problem(
            f"{runtime} looks like a GPU VM image; a TPU VM takes a runtime version; use {recommended}",
            f"use {recommended}",
        )
    elif offered is not None and runtime in offered:
        found.warn(
            f"runtime {runtime} is offered in this zone but not in the compatibility table; check it "
            f"is meant for {gen.label}",
            f"prefer {recommended}",
        )
    else:
        found.problem(
            f"unknown runtime {runtime!r} for {tpu.describe()}; use {recommended}", f"use {recommended}"
        )

    if framework == "tensorflow" and not tf_match:
        found.problem(
            f"TensorFlow on TPU VMs needs a tpu-vm-tf-X.Y.Z runtime, not {runtime}; use {recommended}",
            f"use {recommended}",
        )

    if offered is not None and runtime not in offered:
        alternatives = [r for r in offered if _compatible(table, tpu, r, framework)]
        found.problem(
            f"runtime {runtime} is not offered in this zone (offered: {', '.join(offered) or 'none'})",
            f"use {alternatives[0]}" if alternatives else "try another zone",
        )
    return found.check(accelerator_type, AcceleratorKind.TPU, runtime, framework, framework_version, hardware)


def image_cuda_driver(image: str, table: RuntimeTable | None = None) -> tuple[str | None, int | None]:
    """CUDA version and driver branch a Deep Learning VM image family name promises.

    ``common-cu128-ubuntu-2204-nvidia-570`` -> ("12.8", 570). Without an ``nvidia-NNN`` part the driver
    is the least that CUDA version needs. (None, None) when the name says nothing.
    """
    table = table or default_table()
    name = image.rstrip("/").rsplit("/", 1)[-1]
    m = _IMAGE_CUDA.search(name)
    cuda = f"{m.group('major')}.{m.group('minor')}" if m else None
    d = _IMAGE_DRIVER.search(name)
    driver = int(d.group("driver")) if d else None
    if driver is None and cuda is not None:
        known = [k for k in table.cuda_min_driver if Version(k) <= Version(cuda)]
        if known:
            driver = table.cuda_min_driver[max(known, key=Version)]
    return cuda, driver


def _validate_gpu(
    table: RuntimeTable,
    accelerator_type: str,
    image: str,
    framework: str | None,
    framework_version: str | None,
    offered: Sequence[str] | None,
    python_version: str | None,
) -> RuntimeCheck:
    found = _Findings()
    try:
        gpu = gpu_type(accelerator_type, table)
    except UnknownAcceleratorError as exc:
        found.problem(str(exc), "use one of: " + ", ".join(table.gpu_types))
        return found.check(
            accelerator_type, AcceleratorKind.GPU, image or None, framework, framework_version, None
        )
    hardware = f"{gpu.label}, {gpu.architecture}"

    if framework is not None:
        aliased = table.gpu_aliases.get(framework, framework)
        if aliased != framework:
            found.warn(f"framework {framework!r} on GPU means {aliased!r}")
            framework = aliased
        if framework in table.gpu_tpu_only_frameworks:
            instead = table.gpu_tpu_only_frameworks[framework]
            found.problem(f"{framework} runs on TPUs only; on GPUs use {instead}", f"use {instead}")
        elif framework not in table.gpu_frameworks:
            found.problem(
                f"unknown framework {framework!r} for GPU; known: {', '.join(table.gpu_frameworks)}",
                "pick one of: " + ", ".join(table.gpu_frameworks),
            )
        else:
            rng = table.gpu_frameworks[framework]
            _version_problems(
                found, rng, framework_version, f"{gpu.label} ({gpu.architecture})", gpu.architecture
            )
            _python_problems(found, rng, python_version, None)
            if rng.min_compute_capability and Version(gpu.compute_capability) < Version(
                rng.min_compute_capability
            ):
                found.problem(
                    f"{framework} needs compute capability >= {rng.min_compute_capability}; "
                    f"{gpu.label} has {gpu.compute_capability}",
                    "use a newer GPU type",
                )

    chosen = image or gpu.recommended_image
    if not image and offered is not None and chosen not in offered:
        found.problem(
            f"recommended image {chosen} is not offered (offered: {', '.join(offered) or 'none'})",
            "pick an offered image with a new enough driver",
        )
    if _runtime_generations(table, chosen) or _TF_RUNTIME.match(chosen):
        found.problem(
            f"{chosen} is a TPU runtime version; a GPU VM boots an image; use {gpu.recommended_image}",
            f"use {gpu.recommended_image}",
        )
        return found.check(
            accelerator_type, AcceleratorKind.GPU, chosen, framework, framework_version, hardware
        )

    cuda, driver = image_cuda_driver(chosen, table)
    need = f"{gpu.label} ({gpu.architecture}) needs CUDA >= {gpu.min_cuda} and driver >= {gpu.min_driver}"
    if cuda is None:
        found.warn(
            f"cannot tell the CUDA version of image {chosen} from its name; {need}",
            f"or use {gpu.recommended_image}",
        )
    else:
        if Version(cuda) < Version(gpu.min_cuda):
            found.problem(f"image {chosen} ships CUDA {cuda}; {need}", f"use {gpu.recommended_image}")
        elif driver is not None and driver < gpu.min_driver:
            found.problem(f"image {chosen} ships driver {driver}; {need}", f"use {gpu.recommended_image}")
        rng = table.gpu_frameworks.get(framework or "")
        arch_cuda = rng.min_cuda_by_architecture.get(gpu.architecture) if rng else None
        if arch_cuda and Version(cuda) < Version(arch_cuda):
            found.problem(
                f"{framework} on {gpu.architecture} needs CUDA >= {arch_cuda}; image {chosen} ships {cuda}",
                f"use {gpu.recommended_image}",
            )
    if image and offered is not None and image not in offered:
        found.problem(
            f"image {image} is not offered (offered: {', '.join(offered) or 'none'})",
            f"use {gpu.recommended_image}",
        )
    return found.check(accelerator_type, AcceleratorKind.GPU, chosen, framework, framework_version, hardware)
