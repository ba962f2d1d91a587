"""What a runtime check found: the typed result (:class:`RuntimeCheck`) and the shared version checks.

Kept apart from the TPU and GPU rules so both build their result the same way and every message has
the same shape (problem, warning, what to use instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from interlude.capacity.report import AcceleratorKind
from interlude.runtimes.table import FrameworkRange, version_or_none


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
            framework = f", {self.framework}" + (f" {self.framework_version}" if self.framework_version else "")
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
class Findings:
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


def version_problems(
    found: Findings, rng: FrameworkRange, version: str | None, where: str, architecture: str | None = None
) -> None:
    if version is None:
        return
    try:
        have = Version(version)
    except InvalidVersion:
        found.problem(f"{rng.name} version {version!r} is not a version number", f"pass e.g. {rng.min or '1.0'}")
        return
    floor = version_or_none(rng.min)
    arch_floor = version_or_none(rng.min_by_architecture.get(architecture or ""))
    if arch_floor is not None and (floor is None or arch_floor > floor):
        floor = arch_floor
    if floor is not None and have < floor:
        found.problem(f"{rng.name} {version} is older than {where} needs (>= {floor})", f"use {rng.name} >= {floor}")
    ceiling = version_or_none(rng.max)
    if ceiling is not None and have > ceiling:
        found.problem(
            f"{rng.name} {version} is newer than {where} supports (<= {ceiling})",
            f"use {rng.name} <= {ceiling}",
        )


def _python_floor_applies(rng: FrameworkRange, framework_version: str | None) -> bool:
    """The Python floor holds from ``python_min_from`` on (vllm-tpu: 3.11 from 0.11.1; earlier 3.10 ran it);
    with no framework version given the newest release's floor holds."""
    since = version_or_none(rng.python_min_from)
    if since is None or framework_version is None:
        return True
    try:
        return Version(framework_version) >= since
    except InvalidVersion:
        return True


def python_problems(
    found: Findings,
    rng: FrameworkRange,
    python_version: str | None,
    system_python: str | None,
    framework_version: str | None = None,
) -> None:
    need = version_or_none(rng.python_min)
    if need is None or not _python_floor_applies(rng, framework_version):
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


def note_warning(found: Findings, rng: FrameworkRange) -> None:
    """A framework row's caveat (``note``) reaches the user as a warning."""
    if rng.note:
        found.warn(f"{rng.name}: {rng.note}")
