"""RunSpec: the one typed record of a run's parameters, built once by `resolve_run`.

Why one record: the params used to travel as a loose dict read in dozens of places, each with its own
fallback (the same poll interval defaulted to 1, 5 and 12 seconds in three modules). Here every
param has exactly one default, one check and one type; the DAG's trigger form is generated from the
same table (`form_schema()`), so the form, the code and the tests cannot disagree.

Validation is pure (no cloud calls) and names the param in every message, so bad input is refused in
the first task, before anything is created; the checks live in `interlude.training.spec_checks` (what a value
may be), this module is the table (what can be asked). Checks that need the cloud (does the zone exist, is the
bucket writable) live in `interlude.training.preflight`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlude.params import ParamsError, coerce_params, form_schema, param, param_names
from interlude.training.spec_checks import PLATFORMS, spec_problems
from interlude.training.spec_checks import bucket_problem as bucket_problem  # re-exported: was defined here

DEFAULT_ZONES: tuple[str, ...] = ("us-central1-a", "us-central2-b")
MAX_STEPS = 10_000_000
"""A week of 16 steps/s; anything larger is a typo (10^30 steps once got through to provisioning)."""

PROFILES = ("reference-portable", "maxtext-tpu-only", "cuda-kernels-gpu-only")
STRATEGIES = ("tpu_first", "gpu_first")
# Where a stage can run (issue 35). Google now documents TPUs through three surfaces: the Cloud TPU API's nodes and
# queued resources, Compute Engine's TPU machine types (https://cloud.google.com/compute/docs/accelerator-optimized-machines)
# and GKE node pools ("For Ironwood (TPU7x), you must use Google Kubernetes Engine",
# https://cloud.google.com/tpu/docs/tpu7x). GPUs are Compute Engine VMs or GKE node pools.
DEFAULT_PLATFORMS: tuple[str, ...] = ("tpu_api", "compute")  # TPU nodes, GPU VMs: what every run did before
FRAMEWORKS = ("jax", "pytorch-xla", "tensorflow", "vllm-tpu", "pytorch")
RESUME_POLICIES = ("auto", "fresh")
# The reference trainer's model sizes (interlude_workload.llm.train_step.SIZES; a test keeps the two equal).
MODEL_SIZES = ("small", "tiny")


class RunSpecError(ParamsError):
    """Bad input, found before anything is provisioned. Retrying cannot fix it: the params must change."""


_param = param


def _optional(description: str, **schema: Any) -> Any:
    return _param(None, {"type": ["null", "string"], **schema}, description)


@dataclass(frozen=True)
class RunSpec:
    """Everything a run needs to know, with the single default of every param.

    Durations are in seconds of the cloud the run talks to, except the maintenance policy's knobs
    (``down_budget_seconds`` and the ones after it): Google-real seconds, which the connection's
    ``time_scale`` maps to the local cloud's faster clock, so their defaults are right on Google.
    """

    # -- params (the trigger form) -------------------------------------------------------------------
    model_profile: str = _param(
        PROFILES[0],
        {"type": "string", "enum": list(PROFILES)},
        "What the model runs on and what converting it would cost.",
    )
    tpu_types: tuple[str, ...] = _param(
        (),
        {"type": "array", "items": {"type": "string"}, "maxItems": 16},
        "TPU slice types to try, in order of preference (e.g. v5litepod-16 for 4 hosts of 4 chips); empty = the "
        "profile's. A multi-host slice is asked for as a queued resource and trains on every host.",
    )
    platforms: tuple[str, ...] = _param(
        DEFAULT_PLATFORMS,
        {"type": "array", "items": {"type": "string", "enum": list(PLATFORMS)}, "minItems": 1, "uniqueItems": True},
        "Where the run may train, in order of preference: tpu_api (Cloud TPU nodes and queued resources), compute "
        "(Compute Engine VMs: GPUs, and TPU machine types), gke (a JobSet on GKE node pools; the only one for TPU7x).",
    )
    strategy: str = _param(STRATEGIES[0], {"type": "string", "enum": list(STRATEGIES)}, "Which decision tree to walk.")
    zones: tuple[str, ...] = _param(
        DEFAULT_ZONES,
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "Candidate zones, in order of preference.",
    )
    framework: str = _param(
        FRAMEWORKS[0],
        {"type": "string", "enum": list(FRAMEWORKS)},
        "The training framework, checked against the chosen hardware.",
    )
    framework_version: str | None = _optional("Framework version; empty = any supported version.")
    tpu_runtime_version: str | None = _optional("TPU software version; empty = the one recommended for the TPU.")
    gpu_image: str | None = _optional("GPU VM image family; empty = the one recommended for the GPU.")
    tpu_image: str | None = _optional(
        "Image family of a TPU VM created on Compute Engine (platforms compute); empty = Google's TPU OS image."
    )
    bucket: str = _param(
        "interlude-local",
        {"type": "string", "minLength": 3, "maxLength": 63},
        "GCS bucket for checkpoints, events and the report (must exist and be writable).",
    )
    train_steps: int = _param(60, {"type": "integer", "minimum": 1, "maximum": MAX_STEPS}, "Training steps.")
    finetune_steps: int = _param(30, {"type": "integer", "minimum": 1, "maximum": MAX_STEPS}, "Fine-tuning steps.")
    checkpoint_every: int = _param(
        10, {"type": "integer", "minimum": 1, "maximum": MAX_STEPS}, "Periodic checkpoint interval, in steps."
    )
    seed: int = _param(0, {"type": "integer", "minimum": 0, "maximum": 2**32 - 1}, "Seed: same seed, same weights.")
    step_seconds: float = _param(
        0.1, {"type": "number", "minimum": 0, "maximum": 60}, "Pacing of the reference trainer (seconds per step)."
    )
    model_size: str = _param(
        MODEL_SIZES[0],
        {"type": "string", "enum": list(MODEL_SIZES)},
        "The reference model's size: small (the demo's Llama, ~1.7 M parameters) or tiny (one narrow layer, "
        "for smoke runs).",
    )
    workload_command: tuple[str, ...] = _param(
        (),
        {"type": "array", "items": {"type": "string"}, "maxItems": 64},
        "Your own job instead of the reference trainer: an argv list (run without a shell) of a program that "
        "checkpoints with Orbax into {checkpoint_dir} (starting from {init_from_dir} if set), trains to {steps} and "
        "saves and exits on SIGTERM; also {checkpoint_every}, {seed}, {stage}, {run_key}, {bucket}, {data_date}, "
        "and the same as INTERLUDE_JOB_* variables. Empty = the reference trainer.",
    )
    data_date: str | None = _optional("Fine-tuning data slice (YYYY-MM-DD); empty = the run's data interval start.")
    spot: bool = _param(
        False, {"type": "boolean"}, "Use Spot capacity: cheaper, preempted without notice (resumes from checkpoints)."
    )
    resume_policy: str = _param(
        RESUME_POLICIES[0],
        {"type": "string", "enum": list(RESUME_POLICIES)},
        "auto: resume from the latest committed checkpoints; fresh: start over "
        "(a reprocessing backfill reuses run ids). Retries of a step always resume.",
    )
    plan_only: bool = _param(False, {"type": "boolean"}, "Stop after validation; create nothing.")
    require_conversion_approval: bool = _param(
        False,
        {"type": "boolean"},
        "When the tree chooses to convert the model to the other accelerator family, wait for a person to "
        "approve the effort estimate (Required actions) before going on.",
    )
    drill_maintenance: bool = _param(
        False, {"type": "boolean"}, "Rehearse maintenance in each stage (simulateMaintenanceEvent)."
    )
    maintenance_policy: str = _param(
        "by_notice",
        {"type": "string", "enum": ["by_notice", "checkpoint_at_notice"]},
        "by_notice: on a long maintenance notice keep training and checkpoint just before the window, and "
        "start the maintenance early at a natural pause when Google allows it; checkpoint_at_notice: "
        "checkpoint as soon as any notice arrives (the old behaviour, kept for comparison).",
    )
    poll_seconds: float = _param(
        1.0,
        {"type": "number", "minimum": 0.1, "maximum": 3600},
        "How often triggers look at the machine and the checkpoints.",
    )
    restart_timeout_seconds: float = _param(
        120.0,
        {"type": "number", "minimum": 1, "maximum": 86400},
        "With maintenance_policy=checkpoint_at_notice only: how long a machine may stay down before it is "
        "re-provisioned (by_notice waits as Google's figures say: down_budget_seconds, reprovision_margin_seconds).",
    )
    # -- the maintenance policy's knobs (maintenance_policy=by_notice), in Google-real seconds: the local cloud's
    # -- connection time_scale maps them to its faster clock (interlude.stage.notice_wait.NoticePolicy.real).
    down_budget_seconds: float = _param(
        0.0,
        {"type": "number", "minimum": 0, "maximum": 7 * 86400},
        "How long a machine that is down, with no maintenance window end from Google, is waited for before it "
        "is re-provisioned; 0 = Google's figure for the machine's kind (GPU VM 1 h, TPU 1 h, multi-host TPU "
        "slice 3 h, Spot none). A machine Google reports gone (deleted, PREEMPTED, TERMINATED without restart) "
        "is re-provisioned at once. Google-real seconds.",
    )
    reprovision_margin_seconds: float = _param(
        600.0,
        {"type": "number", "minimum": 0, "maximum": 86400},
        "A machine still down this long after its maintenance window's end (windowEndTime) is re-provisioned. "
        "Google-real seconds.",
    )
    checkpoint_margin_commits: float = _param(
        3.0,
        {"type": "number", "minimum": 1, "maximum": 100},
        "On a long notice the last checkpoint starts this many measured checkpoint commits before the window.",
    )
    checkpoint_margin_min_seconds: float = _param(
        60.0,
        {"type": "number", "minimum": 0, "maximum": 86400},
        "... and at least this long before it. Google-real seconds.",
    )
    start_early_within_seconds: float = _param(
        900.0,
        {"type": "number", "minimum": 0, "maximum": 7 * 86400},
        "Right after a checkpoint, start a pending maintenance early (performMaintenance, when Google allows "
        "it) if its window opens within this long. Google-real seconds.",
    )
    stall_timeout_seconds: float = _param(
        600.0,
        {"type": "number", "minimum": 10, "maximum": 86400},
        "A READY machine whose workload makes no progress for this long is restarted once, then the stage fails.",
    )
    api_outage_budget_seconds: float = _param(
        900.0,
        {"type": "number", "minimum": 0, "maximum": 86400},
        "How long the cloud's control plane may fail to answer before a stage gives up (the workload keeps running).",
    )
    quota_wait_seconds: float = _param(
        600.0,
        {"type": "number", "minimum": 0, "maximum": 7 * 86400},
        "How long provisioning waits for quota to free up before failing.",
    )
    queue_wait_seconds: float = _param(
        3600.0,
        {"type": "number", "minimum": 60, "maximum": 7 * 86400},
        "How long a queued resource may wait for TPU capacity: Google fails it then (validUntilDuration).",
    )
    network: str | None = _optional("VPC network (name or global/networks/NAME); empty = default.")
    subnetwork: str | None = _optional("Subnetwork (name or regions/REGION/subnetworks/NAME); empty = default.")
    service_account: str | None = _optional("Service account email for the machine; empty = the default one.")
    # -- the gke platform (platforms names gke first): a JobSet on a node pool the run creates in this cluster
    gke_cluster: str | None = _optional("GKE cluster the run trains in when platforms names gke first.")
    gke_location: str | None = _optional("The GKE cluster's region or zone (e.g. us-central1).")
    gke_image: str | None = _optional(
        "Container image of the workload for the gke platform (the project's Dockerfile: python with this package)."
    )

    # -- resolved once by resolve_run (not params) ----------------------------------------------------
    dag_id: str = ""
    run_id: str = ""
    run_key: str = ""
    fresh_token: str | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        return param_names(cls)

    @classmethod
    def form_schema(cls) -> dict[str, tuple[Any, dict[str, Any]]]:
        """Each param's default and JSON schema, for the DAG's `Param`s."""
        return form_schema(cls)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], **resolved: Any) -> RunSpec:
        """Check and type the params (every problem at once, each naming its param), then build the spec."""
        values, problems = coerce_params(cls, params)
        # Check the rest too (failed values stand at their defaults), so one message names every problem.
        spec = cls(**values, **resolved)
        problems += spec_problems(spec)
        if problems:
            raise RunSpecError(problems)
        return spec

    def check(self) -> None:
        problems = spec_problems(self)
        if problems:
            raise RunSpecError(problems)

    # ------------------------------------------------------------------ JSON (XCom, trigger kwargs)
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["zones"] = list(self.zones)
        out["workload_command"] = list(self.workload_command)
        out["tpu_types"] = list(self.tpu_types)
        out["platforms"] = list(self.platforms)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | RunSpec) -> RunSpec:
        if isinstance(data, RunSpec):
            return data
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        for name in ("zones", "workload_command", "tpu_types", "platforms"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls.from_dict(json.loads(text))

    # ------------------------------------------------------------------ derived
    def steps_for(self, stage: str) -> int:
        return {"train": self.train_steps, "finetune": self.finetune_steps}[stage]

    def policy_overrides(self) -> dict[str, Any]:
        """The maintenance policy's knobs (interlude.stage.notice_policy.PolicyParams) from this run's params."""
        from interlude.stage.notice_wait import policy_overrides

        return policy_overrides(
            checkpoint_margin_commits=self.checkpoint_margin_commits,
            checkpoint_margin_min_seconds=self.checkpoint_margin_min_seconds,
            start_early_within_seconds=self.start_early_within_seconds,
            reprovision_margin_seconds=self.reprovision_margin_seconds,
            down_budget_seconds=self.down_budget_seconds,
        )

    def profile(self) -> Any:
        """The model profile the trees walk: ``model_profile``'s, with ``tpu_types`` as its TPU candidates if set."""
        from interlude.capacity.profiles import Candidate, get_profile

        profile = get_profile(self.model_profile)
        if not self.tpu_types:
            return profile
        return dataclasses.replace(profile, tpu_candidates=tuple(Candidate(t) for t in self.tpu_types))

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)
