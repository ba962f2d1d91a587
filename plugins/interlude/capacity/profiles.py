"""Model profiles: what a model runs on, what converting it would cost, and which machines it may use.

The decision trees read nothing about a model but its profile, so a profile is the place where a
team writes down "this trainer is JAX-only, porting to CUDA is ~10 person-days" once, as data.
Candidate lists are ordered: first = preferred.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlude.capacity.report import AcceleratorKind, kind_of


@dataclass(frozen=True)
class Candidate:
    """One machine shape to ask for: a TPU slice type, or ``count`` GPUs of a type on ``machine_type``."""

    accelerator_type: str
    count: int = 1
    machine_type: str | None = None

    @property
    def kind(self) -> AcceleratorKind:
        return kind_of(self.accelerator_type)

    def label(self) -> str:
        if self.kind == AcceleratorKind.TPU:
            return self.accelerator_type
        return f"{self.accelerator_type} x{self.count} ({self.machine_type or 'any machine type'})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "accelerator_type": self.accelerator_type,
            "count": self.count,
            "machine_type": self.machine_type,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Candidate:
        return cls(
            accelerator_type=str(data["accelerator_type"]),
            count=int(data.get("count", 1)),
            machine_type=data.get("machine_type"),
        )


@dataclass(frozen=True)
class Conversion:
    """Porting a model to the other accelerator family: feasible or not, and what it would cost."""

    feasible: bool
    person_days: float | None = None
    notes: str = ""

    def summary(self) -> str:
        if not self.feasible:
            return f"not feasible{': ' + self.notes if self.notes else ''}"
        days = f"~{self.person_days:g} person-days" if self.person_days is not None else "effort unestimated"
        return f"feasible, {days}{': ' + self.notes if self.notes else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"feasible": self.feasible, "person_days": self.person_days, "notes": self.notes}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Conversion:
        if not data:
            return NOT_FEASIBLE
        days = data.get("person_days")
        return cls(
            feasible=bool(data.get("feasible", False)),
            person_days=None if days is None else float(days),
            notes=str(data.get("notes", "")),
        )


NOT_FEASIBLE = Conversion(feasible=False, notes="no conversion path recorded for this model")

# Default candidate lists (ordered by preference). GPU shapes carry their machine types.
DEFAULT_TPU_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("v6e-8"),
    Candidate("v5litepod-8"),
    Candidate("v5p-8"),
)
DEFAULT_GPU_CANDIDATES: tuple[Candidate, ...] = (
    Candidate("nvidia-h100-80gb", 8, "a3-highgpu-8g"),
    Candidate("nvidia-a100-80gb", 1, "a2-ultragpu-1g"),
)
DEFAULT_SMALLER_GPUS: tuple[Candidate, ...] = (
    Candidate("nvidia-l4", 1, "g2-standard-8"),
    Candidate("nvidia-tesla-t4", 1, "n1-standard-8"),
)


@dataclass(frozen=True)
class ModelProfile:
    """Everything the decision trees need to know about one model."""

    name: str
    runs_on_tpu: bool
    runs_on_gpu: bool
    convert_to_gpu: Conversion = NOT_FEASIBLE
    convert_to_tpu: Conversion = NOT_FEASIBLE
    tpu_candidates: tuple[Candidate, ...] = DEFAULT_TPU_CANDIDATES
    gpu_candidates: tuple[Candidate, ...] = DEFAULT_GPU_CANDIDATES
    smaller_gpus: tuple[Candidate, ...] = ()
    wait_allowed: bool = False
    max_wait: dt.timedelta = dt.timedelta(0)
    allow_spot: bool = False
    prefer_queued: bool = False
    framework: str | None = None
    framework_version: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        for c in self.tpu_candidates:
            if c.kind != AcceleratorKind.TPU:
                raise ValueError(f"profile {self.name}: {c.accelerator_type} is not a TPU type")
        for c in (*self.gpu_candidates, *self.smaller_gpus):
            if c.kind != AcceleratorKind.GPU:
                raise ValueError(f"profile {self.name}: {c.accelerator_type} is not a GPU type")

    def runs_on(self, kind: AcceleratorKind) -> bool:
        return self.runs_on_tpu if kind == AcceleratorKind.TPU else self.runs_on_gpu

    def conversion_to(self, kind: AcceleratorKind) -> Conversion:
        return self.convert_to_tpu if kind == AcceleratorKind.TPU else self.convert_to_gpu

    def candidates(self, kind: AcceleratorKind) -> tuple[Candidate, ...]:
        return self.tpu_candidates if kind == AcceleratorKind.TPU else self.gpu_candidates

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runs_on_tpu": self.runs_on_tpu,
            "runs_on_gpu": self.runs_on_gpu,
            "convert_to_gpu": self.convert_to_gpu.to_dict(),
            "convert_to_tpu": self.convert_to_tpu.to_dict(),
            "tpu_candidates": [c.to_dict() for c in self.tpu_candidates],
            "gpu_candidates": [c.to_dict() for c in self.gpu_candidates],
            "smaller_gpus": [c.to_dict() for c in self.smaller_gpus],
            "wait_allowed": self.wait_allowed,
            "max_wait_seconds": self.max_wait.total_seconds(),
            "allow_spot": self.allow_spot,
            "prefer_queued": self.prefer_queued,
            "framework": self.framework,
            "framework_version": self.framework_version,
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelProfile:
        def cands(key: str, default: tuple[Candidate, ...]) -> tuple[Candidate, ...]:
            if key not in data or data[key] is None:
                return default
            return tuple(Candidate.from_dict(c) for c in data[key])

        return cls(
            name=str(data["name"]),
            runs_on_tpu=bool(data["runs_on_tpu"]),
            runs_on_gpu=bool(data["runs_on_gpu"]),
            convert_to_gpu=Conversion.from_dict(data.get("convert_to_gpu")),
            convert_to_tpu=Conversion.from_dict(data.get("convert_to_tpu")),
            tpu_candidates=cands("tpu_candidates", DEFAULT_TPU_CANDIDATES),
            gpu_candidates=cands("gpu_candidates", DEFAULT_GPU_CANDIDATES),
            smaller_gpus=cands("smaller_gpus", ()),
            wait_allowed=bool(data.get("wait_allowed", False)),
            max_wait=dt.timedelta(seconds=float(data.get("max_wait_seconds", 0))),
            allow_spot=bool(data.get("allow_spot", False)),
            prefer_queued=bool(data.get("prefer_queued", False)),
            framework=data.get("framework"),
            framework_version=data.get("framework_version"),
            description=str(data.get("description", "")),
        )


# Named example profiles, selectable by DAG params. They describe model families, not promises.
PROFILES: Mapping[str, ModelProfile] = {
    p.name: p
    for p in (
        ModelProfile(
            name="reference-portable",
            runs_on_tpu=True,
            runs_on_gpu=True,
            smaller_gpus=DEFAULT_SMALLER_GPUS,
            wait_allowed=True,
            max_wait=dt.timedelta(hours=2),
            framework="jax",
            description="The reference trainer: plain JAX, runs anywhere.",
        ),
        ModelProfile(
            name="maxtext-tpu-only",
            runs_on_tpu=True,
            runs_on_gpu=False,
            convert_to_gpu=Conversion(True, 10, "swap Pallas TPU kernels for Triton/cuDNN; re-tune sharding"),
            wait_allowed=True,
            max_wait=dt.timedelta(hours=6),
            prefer_queued=True,
            framework="jax",
            description="A TPU-tuned trainer with TPU-only kernels.",
        ),
        ModelProfile(
            name="cuda-kernels-gpu-only",
            runs_on_tpu=False,
            runs_on_gpu=True,
            convert_to_tpu=Conversion(True, 15, "rewrite custom CUDA kernels; port to PyTorch/XLA"),
            smaller_gpus=DEFAULT_SMALLER_GPUS,
            allow_spot=True,
            framework="pytorch",
            description="A PyTorch trainer with hand-written CUDA kernels.",
        ),
    )
}


def get_profile(name: str) -> ModelProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown model profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
