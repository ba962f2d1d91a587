"""RunSpec: the one typed record of a run's parameters, built once by `resolve_run`.

Why one record: the params used to travel as a loose dict read in dozens of places, each with its own
fallback (the same poll interval defaulted to 1, 5 and 12 seconds in three modules). Here every
param has exactly one default, one check and one type; the DAG's trigger form is generated from the
same table (`form_schema()`), so the form, the code and the tests cannot disagree.

Validation is pure (no cloud calls) and names the param in every message, so bad input is refused in
the first task, before anything is created. Checks that need the cloud (does the zone exist, is the
bucket writable) live in `interlude.training.preflight`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from interlude.params import ParamsError, coerce_params, form_schema, param, param_names, shown

DEFAULT_ZONES: tuple[str, ...] = ("us-central1-a", "us-central2-b")
MAX_STEPS = 10_000_000
"""A week of 16 steps/s; anything larger is a typo (10^30 steps once got through to provisioning)."""

PROFILES = ("reference-portable", "maxtext-tpu-only", "cuda-kernels-gpu-only")
STRATEGIES = ("tpu_first", "gpu_first")
# Where a stage can run (issue 35). Google now documents TPUs through three surfaces: the Cloud TPU API's nodes and
# queued resources, Compute Engine's TPU machine types (https://cloud.google.com/compute/docs/accelerator-optimized-machines)
# and GKE node pools ("For Ironwood (TPU7x), you must use Google Kubernetes Engine",
# https://cloud.google.com/tpu/docs/tpu7x). GPUs are Compute Engine VMs or GKE node pools.
PLATFORMS = ("tpu_api", "compute", "gke")
DEFAULT_PLATFORMS: tuple[str, ...] = ("tpu_api", "compute")  # TPU nodes, GPU VMs: what every run did before
FRAMEWORKS = ("jax", "pytorch-xla", "tensorflow", "vllm-tpu", "pytorch")
RESUME_POLICIES = ("auto", "fresh")
# The reference trainer's model sizes (interlude_workload.llm.train_step.SIZES; a test keeps the two equal).
MODEL_SIZES = ("small", "tiny")

# Google's shapes (https://cloud.google.com/compute/docs/regions-zones, .../naming-resources,
# https://cloud.google.com/storage/docs/buckets#naming, https://cloud.google.com/iam/docs/service-account-overview).
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]{1,2}-[a-z]$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
NETWORK_RE = re.compile(
    r"^((projects/[a-z][-a-z0-9.:]{4,61}[a-z0-9]/)?global/networks/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
)
SUBNETWORK_RE = re.compile(
    r"^((projects/[a-z][-a-z0-9.:]{4,61}[a-z0-9]/)?regions/[a-z]+-[a-z]+[0-9]{1,2}/subnetworks/)?"
    r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
)
SERVICE_ACCOUNT_RE = re.compile(
    r"^([a-z][-a-z0-9]{4,28}[a-z0-9]@[a-z][-a-z0-9.:]{4,61}[a-z0-9]\.iam\.gserviceaccount\.com"
    r"|[0-9]{6,20}-compute@developer\.gserviceaccount\.com)$"
)
BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
RUNTIME_RE = re.compile(r"^[a-z0-9][-a-z0-9.]{0,62}$")
VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+){0,2}$")
DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")


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
        problems += _problems(spec)
        if problems:
            raise RunSpecError(problems)
        return spec

    def check(self) -> None:
        problems = _problems(self)
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


# ---------------------------------------------------------------------- coercion and checks
def bucket_problem(bucket: str) -> str | None:
    """GCS bucket naming rules (https://cloud.google.com/storage/docs/buckets#naming), the subset we accept.

    Dotted names (domain-verified buckets, up to 222 chars) are refused: they need a verified domain.
    """
    if not BUCKET_RE.match(bucket) or ".." in bucket or "." in bucket:
        return (
            f"bucket: {shown(bucket)} is not a valid bucket name (3-63 of a-z, 0-9, '-', '_', starting and ending "
            "with a letter or digit)"
        )
    if bucket.startswith("goog") or "google" in bucket or "g00gle" in bucket:
        return f"bucket: {shown(bucket)}: names starting with 'goog' or containing 'google' are reserved by GCS"
    try:
        ipaddress.ip_address(bucket)
        return f"bucket: {shown(bucket)} is an IP address, which GCS does not allow"
    except ValueError:
        return None


def _shape_problems(spec: RunSpec) -> list[str]:
    out: list[str] = []
    for zone in spec.zones:
        if not ZONE_RE.match(zone):
            out.append(f"zones: {shown(zone)} is not a zone name (like us-central1-a)")
    if len(set(spec.zones)) != len(spec.zones):
        out.append("zones: a zone is listed twice")
    if (problem := bucket_problem(spec.bucket)) is not None:
        out.append(problem)
    shapes = (
        ("network", spec.network, NETWORK_RE),
        ("subnetwork", spec.subnetwork, SUBNETWORK_RE),
        ("service_account", spec.service_account, SERVICE_ACCOUNT_RE),
        ("tpu_runtime_version", spec.tpu_runtime_version, RUNTIME_RE),
        ("gpu_image", spec.gpu_image, NAME_RE),
        ("tpu_image", spec.tpu_image, NAME_RE),
        ("framework_version", spec.framework_version, VERSION_RE),
    )
    for name, value, pattern in shapes:
        if value is not None and not pattern.match(value):
            out.append(f"{name}: {shown(value)} does not have the shape Google expects")
    return out


def _range_problems(spec: RunSpec) -> list[str]:
    out: list[str] = []
    for f in dataclasses.fields(spec):
        schema = f.metadata.get("param") or {}
        value = getattr(spec, f.name)
        if "enum" in schema and value not in schema["enum"]:
            out.append(f"{f.name}: {shown(value)} is not one of {', '.join(schema['enum'])}")
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{f.name}: must be at least {schema['minimum']} (got {shown(value)})")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{f.name}: must be at most {schema['maximum']} (got {shown(value)})")
    if not spec.zones:
        out.append("zones: list at least one zone")
    if spec.checkpoint_every > spec.train_steps:
        out.append(f"checkpoint_every: must not exceed train_steps ({spec.checkpoint_every} > {spec.train_steps})")
    return out


def _date_problems(spec: RunSpec) -> list[str]:
    if spec.data_date is None:
        return []
    if DATE_RE.match(spec.data_date):
        try:
            dt.date.fromisoformat(spec.data_date)
            return []
        except ValueError:
            pass
    return [f"data_date: {shown(spec.data_date)} is not a date (YYYY-MM-DD)"]


def _problems(spec: RunSpec) -> list[str]:
    from interlude_workload.job_command import problems as command_problems

    command: list[str] = command_problems(spec.workload_command)
    return (
        _range_problems(spec)
        + _shape_problems(spec)
        + _date_problems(spec)
        + _tpu_type_problems(spec)
        + command
        + _gke_problems(spec)
    )


LOCATION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]{1,2}(-[a-z])?$")
GKE_CLUSTER_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


def _gke_problems(spec: RunSpec) -> list[str]:
    """The gke platform's params, and what its stage does not do (yet), each naming its param.

    A value given is checked whatever ``platforms`` says (nothing unchecked reaches a URL or a manifest); the
    three are required, and the zone and the shapes the JobSet renders checked, when gke is the first choice.
    """
    from interlude.stage.jobset import image_problem

    wanted = spec.platforms[:1] == ("gke",)  # a later gke without a cluster is left out of the tree (gke.chosen)
    out: list[str] = []
    if spec.gke_cluster is not None and not GKE_CLUSTER_RE.match(spec.gke_cluster):
        out.append(f"gke_cluster: {shown(spec.gke_cluster)} is not a GKE cluster name")
    elif wanted and not spec.gke_cluster:
        out.append(f"gke_cluster: {shown(spec.gke_cluster)} is not a GKE cluster name (required for the gke platform)")
    if spec.gke_location is not None and not LOCATION_RE.match(spec.gke_location):
        out.append(f"gke_location: {shown(spec.gke_location)} is not a region or zone")
    elif wanted and not spec.gke_location:
        out.append(f"gke_location: {shown(spec.gke_location)} is not a region or zone (required for the gke platform)")
    elif (
        wanted
        and spec.zones
        and spec.gke_location
        and not (spec.zones[0] == spec.gke_location or spec.zones[0].startswith(spec.gke_location + "-"))
    ):
        out.append(
            f"zones: {shown(spec.zones[0])} (where the run's node pool goes) is not in gke_location {spec.gke_location}"
        )
    if spec.gke_image is not None and image_problem(spec.gke_image) is not None:
        out.append(f"gke_image: {shown(spec.gke_image)} is not a container image (REGISTRY/PATH[:TAG][@sha256:DIGEST])")
    elif wanted and not spec.gke_image:
        out.append("gke_image: required for the gke platform (the workload's container image)")
    return out + (_gke_type_problems(spec) if wanted else [])


def _gke_type_problems(spec: RunSpec) -> list[str]:
    from interlude.stage.jobset import shape_for

    out: list[str] = []
    types = list(spec.tpu_types) or [c.accelerator_type for c in spec.profile().tpu_candidates]
    shaped = []
    for name in types:
        try:
            shaped.append(shape_for(name))
        except ValueError as exc:
            if spec.tpu_types:
                out.append(f"tpu_types: {exc}")
    if not shaped and not spec.tpu_types:
        out.append(f"tpu_types: the profile's TPU types {types} are none GKE runs here; name one (e.g. v6e-4)")
    refused = (
        ("drill_maintenance", spec.drill_maintenance, "GKE drains nodes itself; drill with a scheduled maintenance"),
        ("workload_command", bool(spec.workload_command), "the gke platform runs the reference workload's agent"),
        ("spot", spec.spot, "Spot node pools are not created by the gke platform yet"),
    )
    out += [f"{name}: not supported with platforms gke ({why})" for name, bad, why in refused if bad]
    return out


def _tpu7x_problem(spec: RunSpec, name: str) -> str | None:
    """TPU7x is GKE's only (interlude.capacity.platforms): the TPU API's runtime table does not know it."""
    from interlude.capacity.platforms import tpu7x_problem

    if (problem := tpu7x_problem(name)) is not None:
        return f"tpu_types: {problem}"
    if "gke" not in spec.platforms:
        return f"tpu_types: {shown(name)} is TPU7x (Ironwood), provisioned on GKE only: add gke to platforms"
    return None


def _tpu_type_problems(spec: RunSpec) -> list[str]:
    from interlude.capacity.platforms import is_tpu7x
    from interlude.runtimes.tpu import UnknownAcceleratorError, parse_tpu_type

    out: list[str] = []
    for name in spec.tpu_types:
        if is_tpu7x(name):
            if (problem := _tpu7x_problem(spec, name)) is not None:
                out.append(problem)
            continue
        try:
            parse_tpu_type(name)
        except UnknownAcceleratorError as exc:
            out.append(f"tpu_types: {shown(name)} is not a TPU type ({exc})")
    if len(set(spec.tpu_types)) != len(spec.tpu_types):
        out.append("tpu_types: a type is listed twice")
    return out + _platform_problems(spec)


def _platform_problems(spec: RunSpec) -> list[str]:
    out: list[str] = []
    for name in spec.platforms:
        if name not in PLATFORMS:
            out.append(f"platforms: {shown(name)} is not one of {', '.join(PLATFORMS)}")
    if not spec.platforms:
        out.append("platforms: name at least one")
    if len(set(spec.platforms)) != len(spec.platforms):
        out.append("platforms: a platform is listed twice")
    return out
