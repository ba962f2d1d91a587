"""TPU side of the check: accelerator type names, hosts per slice, and which runtime fits which generation.

Sources: TPU software versions (https://cloud.google.com/tpu/docs/runtimes) and the per-generation pages
named in ``plugins/interlude/runtimes/runtimes.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from interlude.capacity.report import AcceleratorKind
from interlude.runtimes import tensorflow as tfr
from interlude.runtimes.findings import Findings, RuntimeCheck, note_warning, python_problems, version_problems
from interlude.runtimes.table import RuntimeTable, TpuGeneration, default_table

_GPU_IMAGE = re.compile(r"(?:^|[-_])cu1\d\d(?:$|[-_])")


class UnknownAcceleratorError(ValueError):
    """An accelerator type the table does not know."""


@dataclass(frozen=True)
class TpuType:
    """A parsed TPU accelerator type such as ``v5litepod-16``."""

    accelerator_type: str
    generation: TpuGeneration
    size: int

    @property
    def hosts(self) -> int:
        """Hosts (TPU VMs, workers) in the slice: one up to the single-host maximum, else the slice over
        the multi-host host size (v6e-8 = 1 host of 8 chips; v6e-16 = 4 hosts of 4 chips)."""
        gen = self.generation
        if self.size <= gen.single_host_max:
            return 1
        return -(-self.size // gen.multi_host_per_host)

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
            if not gen.published_size(int(rest)):
                raise UnknownAcceleratorError(
                    f"accelerator_type {name!r} is not a {gen.label} slice Google publishes "
                    f"({gen.describe_sizes()}; {gen.source})"
                )
            return TpuType(accelerator_type=name, generation=gen, size=int(rest))
    known = ", ".join(f"{g.prefix}N ({g.label})" for g in table.tpu_generations.values())
    raise UnknownAcceleratorError(f"unknown TPU accelerator type {name!r}; known: {known}")


def _safe_version(text: str | None) -> str | None:
    try:
        return str(Version(text)) if text else None
    except InvalidVersion:
        return None


def tf_runtime(tpu: TpuType, version: str | None, table: RuntimeTable, pool: Sequence[str] | None = None) -> str:
    """The TensorFlow runtime to use (from ``pool``, the zone's list, else Google's published names);
    the newest that fits when the requested version has none."""
    names = tfr.published(table) if pool is None else pool
    gen, hosts = tpu.generation, tpu.hosts
    chosen = tfr.choose(table, gen, hosts, _safe_version(version), names) or tfr.choose(table, gen, hosts, None, names)
    return chosen or tfr.choose(table, gen, hosts, None, tfr.published(table)) or ""


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
        return tf_runtime(tpu, framework_version, table)
    return tpu.generation.recommended_runtime


def _runtime_generations(table: RuntimeTable, runtime: str) -> list[TpuGeneration]:
    return [g for g in table.tpu_generations.values() if runtime in g.runtimes or runtime in g.legacy_runtimes]


def is_tpu_runtime(table: RuntimeTable, name: str) -> bool:
    return bool(_runtime_generations(table, name)) or tfr.looks_like_tf_runtime(name)


def _compatible(table: RuntimeTable, tpu: TpuType, runtime: str, framework: str | None) -> bool:
    tf = tfr.parse_tf_runtime(runtime)
    if tf is not None:
        return not tfr.why_not_fits(table, tpu.generation, tpu.hosts, tf) and framework in (None, "tensorflow")
    return framework != "tensorflow" and runtime in tpu.generation.runtimes


def _framework(found: Findings, table: RuntimeTable, tpu: TpuType, framework: str | None, ctx: _Ctx) -> str | None:
    """Check the framework and its version against the generation; returns the canonical name."""
    if framework is None:
        return None
    gen = tpu.generation
    aliased = table.tpu_aliases.get(framework, framework)
    if aliased != framework:
        found.warn(f"framework {framework!r} on TPU means {aliased!r}")
    if aliased not in table.tpu_frameworks:
        found.problem(
            f"unknown framework {aliased!r} for TPU; known: {', '.join(table.tpu_frameworks)}",
            "pick one of: " + ", ".join(table.tpu_frameworks),
        )
        return None
    if aliased not in gen.frameworks:
        where = [g for g in table.tpu_generations.values() if aliased in g.frameworks]
        found.problem(
            f"{aliased} does not run on {tpu.describe()}; it runs on " + ", ".join(g.label for g in where),
            "use a " + " or ".join(f"{g.prefix}N" for g in where) + f" type for {aliased}",
        )
        return aliased
    rng = gen.frameworks[aliased]
    version_problems(found, rng, ctx.framework_version, gen.label)
    python_problems(found, rng, ctx.python_version, table.system_python, ctx.framework_version)
    note_warning(found, rng)
    return aliased


@dataclass(frozen=True)
class _Ctx:
    framework_version: str | None
    offered: Sequence[str] | None
    python_version: str | None


def _recommended(table: RuntimeTable, tpu: TpuType, framework: str | None, ctx: _Ctx) -> str:
    if framework == "tensorflow":
        return tf_runtime(tpu, ctx.framework_version, table)
    return tpu.generation.recommended_runtime


def _blank_runtime(found: Findings, table: RuntimeTable, tpu: TpuType, framework: str | None, ctx: _Ctx) -> str:
    """No runtime asked for: the recommended one, or a compatible one the zone offers."""
    if framework == "tensorflow" and ctx.framework_version and _safe_version(ctx.framework_version):
        _missing_tf_release(found, table, Version(ctx.framework_version))
    chosen = _recommended(table, tpu, framework, ctx)
    if ctx.offered is None or chosen in ctx.offered:
        return chosen
    if framework == "tensorflow":
        gen, hosts, version = tpu.generation, tpu.hosts, _safe_version(ctx.framework_version)
        best = tfr.choose(table, gen, hosts, version, ctx.offered) or tfr.choose(table, gen, hosts, None, ctx.offered)
        alternatives = [best] if best else []
    else:
        alternatives = [r for r in ctx.offered if _compatible(table, tpu, r, framework)]
    if alternatives:
        found.warn(f"recommended runtime {chosen} is not offered in this zone; using {alternatives[0]}")
        return alternatives[0]
    found.problem(
        f"runtime {chosen} for {tpu.describe()} is not offered in this zone "
        f"(offered: {', '.join(ctx.offered) or 'none'})",
        "try another zone",
    )
    return chosen


def _missing_tf_release(found: Findings, table: RuntimeTable, version: Version) -> None:
    """TensorFlow releases without a TPU runtime (there is no 2.16.0 runtime; 2.16.1 and 2.16.2 exist)."""
    if any(Version(v) == version for v in table.tensorflow.endings) or version > tfr.newest_published(table):
        return
    others = tfr.same_minor(table, version)
    found.warn(
        f"Google publishes no TPU runtime for TensorFlow {version}"
        + (f" (TensorFlow {', '.join(sorted(others))} exist)" if others else "")
    )


def _tf_named_runtime(
    found: Findings, table: RuntimeTable, tpu: TpuType, runtime: str, framework: str | None, ctx: _Ctx
) -> None:
    gen = tpu.generation
    tf = tfr.parse_tf_runtime(runtime)
    if tf is None:
        found.problem(
            f"runtime {runtime} is not a TensorFlow runtime name ({tfr.GRAMMAR})",
            f"use {tf_runtime(tpu, None, table, ctx.offered)}",
        )
        return
    why = tfr.why_not_fits(table, gen, tpu.hosts, tf)
    if why:
        found.problem(
            f"runtime {runtime} does not run on {tpu.describe()}: {why}",
            f"use {tf_runtime(tpu, str(tf.version), table, ctx.offered)}",
        )
    if ctx.offered is None:
        _unpublished(found, table, tpu, tf)
    if framework == "tensorflow" and ctx.framework_version and _safe_version(ctx.framework_version):
        if Version(ctx.framework_version) != tf.version:
            found.problem(
                f"runtime {runtime} ships TensorFlow {tf.version}, not {ctx.framework_version}",
                f"use {tf_runtime(tpu, ctx.framework_version, table, ctx.offered)}",
            )
    elif framework not in (None, "tensorflow"):
        found.warn(
            f"runtime {runtime} is a TensorFlow runtime; {framework} is better served by {gen.recommended_runtime}",
            f"use {gen.recommended_runtime}",
        )


def _unpublished(found: Findings, table: RuntimeTable, tpu: TpuType, tf: tfr.TfRuntime) -> None:
    """Without the zone's list, Google's published names say whether the runtime exists."""
    if tf.name in tfr.published(table):
        return
    if tf.version > tfr.newest_published(table):
        found.warn(f"runtime {tf.name} is newer than the compatibility table; check the zone lists it")
        return
    others = tfr.same_minor(table, tf.version)
    found.problem(
        f"Google publishes no runtime {tf.name}"
        + (f" (TensorFlow {', '.join(sorted(others))} exist)" if others else ""),
        f"use {tf_runtime(tpu, str(tf.version), table)}",
    )


def _named_runtime(
    found: Findings, table: RuntimeTable, tpu: TpuType, runtime: str, framework: str | None, ctx: _Ctx
) -> None:
    gen = tpu.generation
    recommended = _recommended(table, tpu, framework, ctx)
    if tfr.looks_like_tf_runtime(runtime):
        _tf_named_runtime(found, table, tpu, runtime, framework, ctx)
        return
    if framework == "tensorflow":
        found.problem(
            f"TensorFlow on TPU VMs needs a tpu-vm-tf-X.Y.Z runtime, not {runtime}; use {recommended}",
            f"use {recommended}",
        )
    if runtime in gen.runtimes:
        return
    if runtime in gen.legacy_runtimes:
        found.warn(f"runtime {runtime} is a legacy runtime for {gen.label}", f"prefer {gen.recommended_runtime}")
    elif others := _runtime_generations(table, runtime):
        found.problem(
            f"runtime {runtime} does not run on {tpu.describe()}; use {recommended} ({runtime} is "
            f"for {', '.join(g.label for g in others)})",
            f"use {recommended}",
        )
    elif _GPU_IMAGE.search(runtime) or runtime.startswith(("common-", "pytorch-", "tf-")):
        found.problem(
            f"{runtime} looks like a GPU VM image; a TPU VM takes a runtime version; use {recommended}",
            f"use {recommended}",
        )
    elif ctx.offered is not None and runtime in ctx.offered:
        found.warn(
            f"runtime {runtime} is offered in this zone but not in the compatibility table; check it "
            f"is meant for {gen.label}",
            f"prefer {recommended}",
        )
    else:
        found.problem(f"unknown runtime {runtime!r} for {tpu.describe()}; use {recommended}", f"use {recommended}")


def validate_tpu(
    table: RuntimeTable,
    accelerator_type: str,
    runtime: str,
    framework: str | None,
    framework_version: str | None,
    offered: Sequence[str] | None,
    python_version: str | None,
) -> RuntimeCheck:
    found = Findings()
    ctx = _Ctx(framework_version, offered, python_version)
    try:
        tpu = parse_tpu_type(accelerator_type, table)
    except UnknownAcceleratorError as exc:
        found.problem(str(exc), "use one of: " + ", ".join(f"{g.prefix}8" for g in table.tpu_generations.values()))
        return found.check(accelerator_type, AcceleratorKind.TPU, runtime or None, framework, framework_version, None)
    hardware = tpu.generation.label
    framework = _framework(found, table, tpu, framework, ctx)
    if not runtime:
        chosen = _blank_runtime(found, table, tpu, framework, ctx)
        return found.check(accelerator_type, AcceleratorKind.TPU, chosen, framework, framework_version, hardware)
    _named_runtime(found, table, tpu, runtime, framework, ctx)
    if offered is not None and runtime not in offered:
        alternatives = [r for r in offered if _compatible(table, tpu, r, framework)]
        found.problem(
            f"runtime {runtime} is not offered in this zone (offered: {', '.join(offered) or 'none'})",
            f"use {alternatives[0]}" if alternatives else "try another zone",
        )
    return found.check(accelerator_type, AcceleratorKind.TPU, runtime, framework, framework_version, hardware)
