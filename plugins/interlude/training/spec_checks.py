"""The checks of a RunSpec: every refusal of bad input, each naming its param (``RunSpec.from_params``/``check``).

Apart from ``interlude.training.spec`` because the two change for different reasons: spec.py is the params'
table (what a run can be asked, with one default and type each, and the trigger form generated from it), this is
what a value may be (Google's name shapes, ranges, dates, TPU types, platforms and what the gke platform does not
do yet). Pure, like the spec (no cloud calls); checks that need the cloud live in ``interlude.training.preflight``.

The spec is only read here, through ``SpecFields`` (what the checks read of it), so ``spec`` imports this module at its
top and nothing imports back.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from typing import Any, ClassVar, Protocol

from interlude.params import schema_problems, shown

#: Where a run may train (interlude.capacity.platforms): the params' enum (spec.py) and the check here.
PLATFORMS = ("tpu_api", "compute", "gke")


class SpecFields(Protocol):
    """What the checks read of a RunSpec (interlude.training.spec), read-only: a Protocol, not the class, so the
    import goes one way (spec imports this module; tests/test_house.py finds import loops, type-only ones too)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]  # a dataclass: the range checks read each field's schema

    @property
    def bucket(self) -> str: ...

    @property
    def checkpoint_every(self) -> int: ...

    @property
    def data_date(self) -> str | None: ...

    @property
    def framework_version(self) -> str | None: ...

    @property
    def gke_cluster(self) -> str | None: ...

    @property
    def gke_image(self) -> str | None: ...

    @property
    def gke_location(self) -> str | None: ...

    @property
    def gpu_image(self) -> str | None: ...

    @property
    def network(self) -> str | None: ...

    @property
    def platforms(self) -> tuple[str, ...]: ...

    @property
    def service_account(self) -> str | None: ...

    @property
    def spot(self) -> bool: ...

    @property
    def subnetwork(self) -> str | None: ...

    @property
    def tpu_image(self) -> str | None: ...

    @property
    def tpu_runtime_version(self) -> str | None: ...

    @property
    def tpu_types(self) -> tuple[str, ...]: ...

    @property
    def train_steps(self) -> int: ...

    @property
    def workload_command(self) -> tuple[str, ...]: ...

    @property
    def zones(self) -> tuple[str, ...]: ...

    def profile(self) -> Any: ...


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
# The gke platform's cluster location (a region or a zone) and cluster name.
LOCATION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]{1,2}(-[a-z])?$")
GKE_CLUSTER_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


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


def _shape_problems(spec: SpecFields) -> list[str]:
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


def _range_problems(spec: SpecFields) -> list[str]:
    out = schema_problems(spec)
    if not spec.zones:
        out.append("zones: list at least one zone")
    if spec.checkpoint_every > spec.train_steps:
        out.append(f"checkpoint_every: must not exceed train_steps ({spec.checkpoint_every} > {spec.train_steps})")
    return out


def _date_problems(spec: SpecFields) -> list[str]:
    if spec.data_date is None:
        return []
    if DATE_RE.match(spec.data_date):
        try:
            dt.date.fromisoformat(spec.data_date)
            return []
        except ValueError:
            pass
    return [f"data_date: {shown(spec.data_date)} is not a date (YYYY-MM-DD)"]


def spec_problems(spec: SpecFields) -> list[str]:
    """Every problem of the spec, each naming its param; empty when the spec is good."""
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


def _gke_problems(spec: SpecFields) -> list[str]:
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


def _gke_type_problems(spec: SpecFields) -> list[str]:
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
        ("workload_command", bool(spec.workload_command), "the gke platform runs the reference workload's agent"),
        ("spot", spec.spot, "Spot node pools are not created by the gke platform yet"),
    )
    out += [f"{name}: not supported with platforms gke ({why})" for name, bad, why in refused if bad]
    return out


def _tpu7x_problem(spec: SpecFields, name: str) -> str | None:
    """TPU7x is GKE's only (interlude.capacity.platforms): the TPU API's runtime table does not know it."""
    from interlude.capacity.platforms import tpu7x_problem

    if (problem := tpu7x_problem(name)) is not None:
        return f"tpu_types: {problem}"
    if "gke" not in spec.platforms:
        return f"tpu_types: {shown(name)} is TPU7x (Ironwood), provisioned on GKE only: add gke to platforms"
    return None


def _tpu_type_problems(spec: SpecFields) -> list[str]:
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


def _platform_problems(spec: SpecFields) -> list[str]:
    out: list[str] = []
    for name in spec.platforms:
        if name not in PLATFORMS:
            out.append(f"platforms: {shown(name)} is not one of {', '.join(PLATFORMS)}")
    if not spec.platforms:
        out.append("platforms: name at least one")
    if len(set(spec.platforms)) != len(spec.platforms):
        out.append("platforms: a platform is listed twice")
    return out
