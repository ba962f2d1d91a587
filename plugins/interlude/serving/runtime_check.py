"""Both containers' runtimes, checked before anything is applied.

Why: the pod carries a vLLM TPU container and a vLLM GPU container and only learns which one serves when
it lands on a node. A TPU image without support for the TPU generation, or a GPU image whose CUDA needs a
newer driver than the node's, fails only then - after nodes are paid for, and possibly only on the
fallback path, in the middle of a stockout. So both are checked up front against
``plugins/interlude/serving/serving_runtimes.yaml`` (each row cites its public source):

- TPU image: its tag must be a known vLLM TPU release; the TPU generation must be one the release lists
  as compatible ("recommended" serves; "experimental" warns) - https://docs.vllm.ai/projects/tpu/en/latest/
- GPU image: its CUDA version (from a "-cuNNN" tag suffix or the release's Dockerfile) must be supported
  by the driver GKE installs for the channel on that GPU type (NVIDIA's toolkit/driver table; below the
  toolkit minimum it is refused: vLLM's JIT-compiled kernels need it) and must build for the GPU's
  compute capability; the driver must support the GPU itself; vLLM needs compute capability >= 7.0.

An unknown repository or tag is refused naming the param: a "bad image tag" stops the run here.

- Model loading: each container reads the export the way Google documents for its image
  (interlude.serving.loading): `model_loader=runai_streamer` on an image without the Run:ai streamer's GCS
  backend (vLLM GPU < 0.11.1, vLLM TPU < 0.18.0, or a tag that names no release) cannot load gs:// and is
  refused naming `model_loader`; `auto` takes a Cloud Storage FUSE volume for such an image.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from interlude.serving import loading
from interlude.serving.images import ImageRef, parse_image
from interlude.serving.spec import ServeSpec, ServeSpecError, spec_problems
from interlude.serving.tables import ServingTable, load_table

_CU_SUFFIX = re.compile(r"-cu(?P<major>1[0-9])(?P<minor>[0-9])(?:$|-)")


@dataclass(frozen=True)
class Finding:
    param: str
    severity: str  # "error" refuses the run; "warning" is reported and the run goes on
    message: str
    source: str = ""

    def __str__(self) -> str:
        tail = f" (source: {self.source})" if self.source else ""
        return f"{self.severity}: {self.param}: {self.message}{tail}"


@dataclass(frozen=True)
class RuntimeReport:
    findings: tuple[Finding, ...]
    tpu_generation: str
    gpu_cuda: str | None
    gpu_driver: str | None
    loaders: tuple[tuple[str, str], ...] = ()  # (container kind, loader) for the log: ("tpu", "runai_streamer")

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def errors(self) -> list[str]:
        return [str(f) for f in self.findings if f.severity == "error"]

    def warnings(self) -> list[str]:
        return [str(f) for f in self.findings if f.severity == "warning"]


class RuntimeCheckError(ValueError):
    """A container runtime that cannot serve on its accelerator; the params must change."""

    def __init__(self, report: RuntimeReport) -> None:
        self.report = report
        super().__init__("runtime check failed:\n  - " + "\n  - ".join(report.errors()))


def _v(text: str) -> Version:
    return Version(text)


def tpu_image_findings(image: ImageRef, generation: str, table: ServingTable) -> list[Finding]:
    """Does this vLLM TPU image serve on this TPU generation?"""
    if image.name not in table.tpu_repositories:
        return [
            Finding(
                "tpu_image",
                "error",
                f"{image.name} is not a known vLLM TPU image repository (known: {', '.join(table.tpu_repositories)})",
            )
        ]
    row = table.tpu_images.get(image.tag or "")
    if row is None:
        known = ", ".join(sorted(table.tpu_images))
        return [
            Finding(
                "tpu_image",
                "error",
                f"tag {image.tag or '(digest only)'!r} of {image.name} is not a "
                f"known release; its TPU support cannot be checked (known tags: {known})",
            )
        ]
    if generation in row.recommended:
        return []
    if generation in row.experimental:
        return [
            Finding(
                "tpu_image",
                "warning",
                f"{image.name}:{image.tag} supports TPU {generation} only as experimental",
                row.source,
            )
        ]
    return [
        Finding(
            "tpu_image",
            "error",
            f"{image.name}:{image.tag} does not support TPU {generation} "
            f"(compatible: {', '.join(row.recommended + row.experimental)})",
            row.source,
        )
    ]


def image_cuda(image: ImageRef, table: ServingTable) -> tuple[str | None, list[Finding]]:
    """The CUDA version the vLLM GPU image ships, or an error naming gpu_image."""
    if image.name not in table.gpu_repositories:
        return None, [
            Finding(
                "gpu_image",
                "error",
                f"{image.name} is not a known vLLM GPU image repository (known: {', '.join(table.gpu_repositories)})",
            )
        ]
    tag = image.tag or ""
    if (match := _CU_SUFFIX.search(tag)) is not None:
        return f"{match.group('major')}.{match.group('minor')}", []
    row = table.gpu_image_cuda.get(tag)
    if row is None:
        known = ", ".join(sorted(table.gpu_image_cuda))
        return None, [
            Finding(
                "gpu_image",
                "error",
                f"tag {tag or '(digest only)'!r} of {image.name} is not a "
                f"known release and has no -cuNNN suffix; its CUDA version cannot be checked "
                f"(known tags: {known})",
            )
        ]
    return row[0], []


_TOOLKIT_SRC = "https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html"
_PTX_SRC = (
    "https://docs.vllm.ai/en/latest/usage/troubleshooting.html"
    "#cuda-error-the-provided-ptx-was-compiled-with-an-unsupported-toolchain"
)
_GPU_DRIVER_SRC = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/deployment-considerations.html"


def driver_findings(cuda: str, driver: str, table: ServingTable) -> list[Finding]:
    """Is the GPU driver at least the image CUDA's toolkit minimum?

    Below it the image is refused, not warned about: CUDA's minor version compatibility excludes PTX JIT,
    and vLLM JIT-compiles Triton/PTX kernels, so such a pod crash-loops ("the provided PTX was compiled
    with an unsupported toolchain"); vLLM's documented fix is a newer driver, and GKE documents no
    forward-compatibility path (see plugins/interlude/serving/serving_runtimes.yaml).
    """
    toolkit_min = table.toolkit_min_driver.get(cuda)
    if toolkit_min is None:
        return [Finding("gpu_image", "error", f"CUDA {cuda} is not in the driver table", _TOOLKIT_SRC)]
    if _v(driver) >= _v(toolkit_min):
        return []
    return [
        Finding(
            "gpu_driver_version",
            "error",
            f"driver {driver} cannot run CUDA {cuda} (needs >= {toolkit_min}; below it vLLM's JIT-compiled "
            f"kernels fail: {_PTX_SRC})",
            _TOOLKIT_SRC,
        )
    ]


def gpu_driver_findings(driver: str, gpu_type: str, table: ServingTable) -> list[Finding]:
    """Does the driver support the GPU itself (B200 needs R570, H200 R550, whatever the image)?"""
    floor = table.gpu_types[gpu_type].min_driver
    if floor is None or _v(driver) >= _v(floor):
        return []
    return [
        Finding(
            "gpu_driver_version",
            "error",
            f"driver {driver} does not support {gpu_type} (NVIDIA's first driver for it is {floor})",
            _GPU_DRIVER_SRC,
        )
    ]


def gpu_type_findings(cuda: str, gpu_type: str, table: ServingTable) -> list[Finding]:
    """Does the image's CUDA build for the GPU's compute capability, and does vLLM support that capability?"""
    gpu = table.gpu_types[gpu_type]
    out: list[Finding] = []
    if _v(gpu.compute_capability) < _v(table.min_compute_capability):
        out.append(
            Finding(
                "gpu_type",
                "error",
                f"{gpu_type} has compute capability {gpu.compute_capability}; "
                f"vLLM needs >= {table.min_compute_capability}",
                "https://docs.vllm.ai/en/latest/getting_started/installation/gpu.html",
            )
        )
    if _v(cuda) < _v(gpu.min_cuda):
        out.append(
            Finding(
                "gpu_image",
                "error",
                f"CUDA {cuda} does not build for {gpu_type} (compute capability "
                f"{gpu.compute_capability} needs CUDA >= {gpu.min_cuda})",
                _TOOLKIT_SRC,
            )
        )
    return out


def loader_findings(spec: ServeSpec, table: ServingTable) -> list[Finding]:
    """Can each container load gs:// with the loader the spec asks for? (auto always can: FUSE as the fallback)"""
    if spec.model_loader != "runai_streamer":
        return []
    out: list[Finding] = []
    for kind in loading.KINDS:
        try:
            image = parse_image(f"{kind}_image", spec.tpu_image if kind == "tpu" else spec.gpu_image)
        except ValueError:
            continue  # reported as the image's own finding
        if loading.streams_gcs(image, kind, table):
            continue
        release = loading.image_release(image)
        named = f"release {release}" if release else "no release tag"
        floor = table.model_loaders.streamer_min_version[kind]
        out.append(
            Finding(
                "model_loader",
                "error",
                f"runai_streamer cannot load gs:// in {image} ({named}; "
                f"the {kind.upper()} image streams from Cloud Storage from {floor}): set model_loader to gcsfuse or "
                f"auto, or {kind}_image to a newer release",
                table.model_loaders.streamer_source[kind],
            )
        )
    return out


def _loaders(spec: ServeSpec, table: ServingTable) -> tuple[tuple[str, str], ...]:
    try:
        return tuple((kind, loading.loader_for(spec, kind, table)) for kind in loading.KINDS)
    except ValueError:
        return ()  # an unparsable image: already a finding


def check_runtimes(
    spec: ServeSpec, table: ServingTable | None = None, *, gpu_driver: str | None = None
) -> RuntimeReport:
    """Both containers' runtimes against the table; `gpu_driver` overrides the channel's driver (observed)."""
    table = table or load_table()
    if spec.tpu_type not in table.tpu_shapes or spec.gpu_type not in table.gpu_types:
        raise ServeSpecError(spec_problems(spec, table))  # a spec built without from_params()/check()
    shape = table.tpu_shapes[spec.tpu_type]
    findings: list[Finding] = []
    try:
        findings += tpu_image_findings(parse_image("tpu_image", spec.tpu_image), shape.generation, table)
    except ValueError as exc:
        findings.append(Finding("tpu_image", "error", str(exc).split(": ", 1)[-1]))
    driver = gpu_driver or table.channel_driver(spec.gpu_driver_version, spec.gpu_type)
    cuda: str | None = None
    try:
        cuda, problems = image_cuda(parse_image("gpu_image", spec.gpu_image), table)
        findings += problems
    except ValueError as exc:
        findings.append(Finding("gpu_image", "error", str(exc).split(": ", 1)[-1]))
    if cuda is not None:
        findings += gpu_type_findings(cuda, spec.gpu_type, table)
        if driver is None:
            findings.append(Finding("gpu_driver_version", "error", f"no driver known for {spec.gpu_driver_version!r}"))
        else:
            try:
                findings += gpu_driver_findings(driver, spec.gpu_type, table) + driver_findings(cuda, driver, table)
            except InvalidVersion:
                findings.append(Finding("gpu_driver_version", "error", f"{driver!r} is not a driver version"))
    findings += loader_findings(spec, table)
    return RuntimeReport(tuple(findings), shape.generation, cuda, driver, _loaders(spec, table))


def require_runtimes(
    spec: ServeSpec, table: ServingTable | None = None, *, gpu_driver: str | None = None
) -> RuntimeReport:
    """`check_runtimes`, raising RuntimeCheckError on any error (warnings are returned for the log)."""
    report = check_runtimes(spec, table, gpu_driver=gpu_driver)
    if not report.ok:
        raise RuntimeCheckError(report)
    return report
