"""Runtime compatibility: every TPU generation and GPU type, and every kind of mismatch, with its message.

Tests read the real ``plugins/interlude/runtimes/runtimes.yaml`` (the data is the product), plus small broken tables to
prove a bad file fails loudly at load rather than in the middle of a validation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from interlude import runtimes
from interlude.capacity.profiles import DEFAULT_GPU_CANDIDATES, DEFAULT_SMALLER_GPUS, DEFAULT_TPU_CANDIDATES
from interlude.capacity.report import GPU_MACHINE_TYPES, GPU_QUOTA_METRICS, AcceleratorKind
from interlude.runtimes import (
    RuntimeCheck,
    RuntimeTable,
    RuntimeTableError,
    UnknownAcceleratorError,
    default_table,
    image_cuda_driver,
    parse_tpu_type,
    recommended_gpu_image,
    recommended_runtime,
    validate,
)

GENERATIONS = {  # sample type -> (generation key, recommended runtime)
    "v6e-8": ("v6e", "v2-alpha-tpuv6e"),
    "v5p-8": ("v5p", "v2-alpha-tpuv5"),
    "v5litepod-8": ("v5e", "v2-alpha-tpuv5-lite"),
    "v4-8": ("v4", "tpu-ubuntu2204-base"),
    "v3-8": ("v3", "tpu-ubuntu2204-base"),
    "v2-8": ("v2", "tpu-ubuntu2204-base"),
}
GPU_TYPES = [
    "nvidia-b200",
    "nvidia-h200-141gb",
    "nvidia-h100-mega-80gb",
    "nvidia-h100-80gb",
    "nvidia-a100-80gb",
    "nvidia-tesla-a100",
    "nvidia-l4",
    "nvidia-tesla-t4",
]


def _ok(check: RuntimeCheck) -> None:
    assert check.ok, check.message()
    assert check.problems == ()


def _problem(check: RuntimeCheck, text: str) -> None:
    assert not check.ok, check.message()
    assert any(text in p for p in check.problems), check.message()


@pytest.mark.parametrize(("accel", "expected"), GENERATIONS.items())
def test_recommended_runtime_every_generation(accel: str, expected: tuple[str, str]) -> None:
    gen, runtime = expected
    assert parse_tpu_type(accel).generation.key == gen
    assert recommended_runtime(accel) == runtime
    for framework in ("jax", "pytorch-xla"):
        check = validate(accel, "", framework)
        _ok(check)
        assert check.runtime == runtime and check.kind == AcceleratorKind.TPU
    _ok(validate(accel, runtime, "jax"))
    _ok(validate(accel, runtime, "", None, offered_runtime_versions=[runtime, "other"]))


@pytest.mark.parametrize(
    ("accel", "framework_version", "runtime"),
    [  # Google's real names (https://cloud.google.com/tpu/docs/runtimes)
        ("v6e-8", None, "tpu-vm-tf-2.18.0-pjrt"),
        ("v6e-16", None, "tpu-vm-tf-2.18.0-pod-pjrt"),  # 16 chips = 4 hosts of 4
        ("v5litepod-8", "2.16.1", "tpu-vm-tf-2.16.1-pjrt"),
        ("v5litepod-16", "2.18.0", "tpu-vm-tf-2.18.0-pod-pjrt"),
        ("v5p-8", None, "tpu-vm-tf-2.18.0-pjrt"),
        ("v5p-16", "2.17.0", "tpu-vm-tf-2.17.0-pod-pjrt"),  # 16 TensorCores = 2 hosts
        ("v4-8", "2.12.0", "tpu-vm-tf-2.12.0"),  # plain names for TF 2.10.1-2.14 on v4
        ("v4-8", "2.10.0", "tpu-vm-tf-2.10.0-v4"),  # -v4 names up to 2.10.0
        ("v4-32", "2.10.0", "tpu-vm-tf-2.10.0-pod-v4"),
        ("v4-8", "2.15.0", "tpu-vm-tf-2.15.0-pjrt"),
        ("v3-32", None, "tpu-vm-tf-2.18.0-pod-pjrt"),
        ("v3-8", "2.16.2", "tpu-vm-tf-2.16.2-pjrt"),
        ("v2-8", "2.9.1", "tpu-vm-tf-2.9.1"),
        ("v4-8", "2.9.1", "tpu-vm-tf-2.9.1-v4"),
        ("v4-32", "2.9.1", "tpu-vm-tf-2.9.1-pod-v4"),
    ],
)
def test_tensorflow_runtimes_every_generation(accel: str, framework_version: str | None, runtime: str) -> None:
    assert runtime in default_table().tensorflow.names()
    assert recommended_runtime(accel, "tensorflow", framework_version) == runtime
    check = validate(accel, "", "tensorflow", framework_version)
    _ok(check)
    assert check.runtime == runtime
    _ok(validate(accel, runtime, "tf", framework_version))
    _ok(validate(accel, runtime, "tf", framework_version, offered_runtime_versions=[runtime]))


def test_brief_example_message() -> None:
    check = validate("v5litepod-8", "v2-alpha-tpuv6e", "jax", "0.4.35")
    assert check.problems == (
        "runtime v2-alpha-tpuv6e does not run on v5litepod-8 (TPU v5e); use "
        "v2-alpha-tpuv5-lite (v2-alpha-tpuv6e is for TPU v6e (Trillium))",
    )
    assert check.suggestions == ("use v2-alpha-tpuv5-lite",)


WRONG_RUNTIME_CASES = [
    (accel, other_runtime)
    for accel in GENERATIONS
    for other_runtime in sorted({r for _, r in GENERATIONS.values()} | {"tpu-vm-v4-base", "tpu-vm-base"})
    if other_runtime
    not in (
        default_table().tpu_generations[GENERATIONS[accel][0]].runtimes
        + default_table().tpu_generations[GENERATIONS[accel][0]].legacy_runtimes
    )
]


@pytest.mark.parametrize(("accel", "runtime"), WRONG_RUNTIME_CASES)
def test_runtime_of_another_generation(accel: str, runtime: str) -> None:
    check = validate(accel, runtime, "jax")
    recommended = GENERATIONS[accel][1]
    _problem(check, f"runtime {runtime} does not run on {accel} (")
    _problem(check, f"; use {recommended} ({runtime} is for ")
    assert f"use {recommended}" in check.suggestions


def test_every_generation_has_a_mismatch_case() -> None:
    assert {accel for accel, _ in WRONG_RUNTIME_CASES} == set(GENERATIONS)


@pytest.mark.parametrize(
    ("accel", "runtime", "framework", "version", "problem", "suggestion"),
    [
        (
            "v6e-8",
            "tpu-vm-tf-2.16.1-se",
            "tensorflow",
            "2.16.1",
            "device API -se is not used on TPU v6e",
            "use tpu-vm-tf-2.16.1-pjrt",
        ),
        (
            "v5p-8",
            "tpu-vm-tf-2.16.1",
            "tensorflow",
            None,
            "from TensorFlow 2.15.0 the name must say its device API (-pjrt)",
            "use tpu-vm-tf-2.16.1-pjrt",
        ),
        (  # v2/v3 from TF 2.15 need -se or -pjrt
            "v3-8",
            "tpu-vm-tf-2.15.0",
            "tensorflow",
            None,
            "from TensorFlow 2.15.0 the name must say its device API (-pjrt or -se)",
            "use tpu-vm-tf-2.15.0-pjrt",
        ),
        (
            "v2-8",
            "tpu-vm-tf-2.14.1-pjrt",
            "tensorflow",
            None,
            "TensorFlow before 2.15.0 runs stream executor only; the name has no -pjrt",
            "use tpu-vm-tf-2.14.1",
        ),
        (
            "v6e-8",
            "tpu-vm-tf-2.14.1",
            "tensorflow",
            None,
            "TensorFlow 2.14.1 predates TPU v6e (Trillium) (needs >= 2.15.0)",
            "use tpu-vm-tf-2.18.0-pjrt",
        ),
        (
            "v6e-64",
            "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6",
            "tensorflow",
            None,
            "the slice spans 16 hosts and needs a -pod runtime",
            "use tpu-vm-tf-2.18.0-pod-pjrt",
        ),
        (  # hardware suffixes
            "v6e-8",
            "tpu-vm-tf-2.18.0-pjrt-v5p-and-below",
            "tensorflow",
            None,
            "it is built for v5p-and-below hardware, not TPU v6e (Trillium)",
            "use tpu-vm-tf-2.18.0-pjrt",
        ),
        (
            "v5p-8",
            "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6",
            "tensorflow",
            None,
            "it is built for v5e-and-v6 hardware, not TPU v5p",
            "use tpu-vm-tf-2.18.0-pjrt",
        ),
        (  # v4: -v4 names up to 2.10.0, plain names after
            "v4-8",
            "tpu-vm-tf-2.10.0",
            "tensorflow",
            None,
            "TensorFlow <= 2.10.0 on TPU v4 uses the -v4 names",
            "use tpu-vm-tf-2.10.0-v4",
        ),
        (
            "v4-8",
            "tpu-vm-tf-2.12.0-v4",
            "tensorflow",
            None,
            "the -v4 names stop at TensorFlow 2.10.0",
            "use tpu-vm-tf-2.12.0",
        ),
        (
            "v3-8",
            "tpu-vm-tf-2.10.0-v4",
            "tensorflow",
            None,
            "it is built for v4 hardware, not TPU v3",
            "use tpu-vm-tf-2.10.0",
        ),
        (  # there is no 2.16.0 runtime
            "v5litepod-8",
            "tpu-vm-tf-2.16.0-pjrt",
            "tensorflow",
            None,
            "Google publishes no runtime tpu-vm-tf-2.16.0-pjrt (TensorFlow 2.16.1, 2.16.2 exist)",
            "use tpu-vm-tf-2.16.2-pjrt",
        ),
        (  # v5e/v6e take -pjrt only, also for 2.18.0
            "v6e-8",
            "tpu-vm-tf-2.18.0-se",
            "tensorflow",
            None,
            "device API -se is not used on TPU v6e",
            "use tpu-vm-tf-2.18.0-pjrt",
        ),
        (
            "v4-8",
            "tpu-vm-tf-2.16.1-pjrt",
            "tensorflow",
            "2.15.0",
            "runtime tpu-vm-tf-2.16.1-pjrt ships TensorFlow 2.16.1, not 2.15.0",
            "use tpu-vm-tf-2.15.0-pjrt",
        ),
        (
            "v4-8",
            "tpu-vm-tf-2.16.1-pjrt-v9",
            "tensorflow",
            None,
            "is not a TensorFlow runtime name",
            "use tpu-vm-tf-2.18.0-pjrt",
        ),
        (
            "v5litepod-8",
            "v2-alpha-tpuv5-lite",
            "tensorflow",
            None,
            "TensorFlow on TPU VMs needs a tpu-vm-tf-X.Y.Z runtime",
            "use tpu-vm-tf-2.18.0-pjrt",
        ),
    ],
)
def test_tensorflow_mismatches(
    accel: str, runtime: str, framework: str, version: str | None, problem: str, suggestion: str
) -> None:
    check = validate(accel, runtime, framework, version)
    _problem(check, problem)
    assert suggestion in check.suggestions, check.message()


def test_no_tensorflow_2_16_0_runtime() -> None:
    names = default_table().tensorflow.names()
    assert not [n for n in names if n.startswith("tpu-vm-tf-2.16.0")]
    assert {"tpu-vm-tf-2.16.1-pjrt", "tpu-vm-tf-2.16.2-pjrt", "tpu-vm-tf-2.16.1-se"} <= set(names)
    check = validate("v5litepod-8", "", "tensorflow", "2.16.0")
    _ok(check)
    assert check.runtime == "tpu-vm-tf-2.16.2-pjrt"
    assert "Google publishes no TPU runtime for TensorFlow 2.16.0 (TensorFlow 2.16.1, 2.16.2 exist)" in check.warnings


def test_v6e_tensorflow_floor_is_2_15() -> None:
    _ok(validate("v6e-8", "tpu-vm-tf-2.15.0-pjrt", "tensorflow", "2.15.0"))
    _ok(validate("v6e-8", "", "tensorflow", "2.15.0"))
    _problem(validate("v6e-8", "", "tensorflow", "2.14.1"), "is older than TPU v6e (Trillium) needs (>= 2.15.0)")


def test_the_zone_list_is_the_authority_on_names() -> None:
    # a name newer than the table, that the zone offers, is judged by the grammar only
    offered = ["tpu-vm-tf-2.19.0-pod-pjrt", "v2-alpha-tpuv6e"]
    _ok(validate("v6e-16", "tpu-vm-tf-2.19.0-pod-pjrt", "tensorflow", "2.19.0", offered_runtime_versions=offered))
    chosen = validate("v6e-16", "", "tensorflow", "2.19.0", offered_runtime_versions=offered)
    _ok(chosen)
    assert chosen.runtime == "tpu-vm-tf-2.19.0-pod-pjrt"
    newer = validate("v6e-16", "tpu-vm-tf-2.19.0-pod-pjrt", "tensorflow")
    _ok(newer)
    assert "newer than the compatibility table; check the zone lists it" in newer.warnings[0]


def test_tensorflow_runtime_for_jax_is_a_warning() -> None:
    check = validate("v4-8", "tpu-vm-tf-2.16.1-pjrt", "jax")
    _ok(check)
    assert "better served by tpu-ubuntu2204-base" in check.warnings[0]
    single = validate("v4-8", "tpu-vm-tf-2.16.1-pod-pjrt", "tensorflow", "2.16.1")
    _ok(single)  # -pod on one host works


@pytest.mark.parametrize("accel", ["v3-8", "v2-8"])
def test_vllm_tpu_not_on_v2_v3(accel: str) -> None:
    check = validate(accel, "", "vllm-tpu", "0.9.2", python_version="3.11")
    _problem(check, f"vllm-tpu does not run on {accel}")
    _problem(check, "it runs on TPU v6e (Trillium), TPU v5p, TPU v5e, TPU v4")


@pytest.mark.parametrize("accel", ["v5p-8", "v4-8"])
def test_vllm_tpu_on_v5p_and_v4_with_a_caveat(accel: str) -> None:
    # vLLM's TPU docs up to 0.6 list v4 and v5p; today's vllm-tpu lists v7x, v6e, v5e
    check = validate(accel, "", "vllm-tpu", "0.6.4", python_version="3.10")
    _ok(check)
    assert any("today's vllm-tpu lists v7x, v6e" in w for w in check.warnings), check.message()


@pytest.mark.parametrize("accel", ["v6e-8", "v5litepod-4"])
def test_vllm_tpu_python(accel: str) -> None:
    _ok(validate(accel, "", "vllm-tpu", "0.11.1", python_version="3.11"))
    _ok(validate(accel, "", "vllm-tpu", "0.12.0", python_version="3.12.4"))
    old = validate(accel, "", "vllm-tpu", "0.11.1", python_version="3.10")
    _problem(old, "vllm-tpu needs Python >= 3.11, not 3.10")
    system = validate(accel, "", "vllm", "0.12.0")  # alias, system Python 3.10
    _ok(system)
    assert "framework 'vllm' on TPU means 'vllm-tpu'" in system.warnings
    assert any("the runtime's system Python is 3.10" in w for w in system.warnings)
    assert any("uv python install 3.11" in s for s in system.suggestions)
    _problem(validate(accel, "", "vllm-tpu", "0.12.0", python_version="three"), "not a version number")


@pytest.mark.parametrize(
    ("accel", "framework", "version", "floor"),
    [
        ("v6e-8", "jax", "0.4.30", "0.4.35"),
        ("v6e-8", "pytorch-xla", "2.4.0", "2.5.0"),
        ("v5p-8", "jax", "0.4.10", "0.4.19"),
        ("v5litepod-8", "torch_xla", "2.0", "2.1.0"),
        ("v4-8", "jax", "0.2.25", "0.3.0"),
        ("v3-8", "pytorch", "1.12", "1.13.0"),
        ("v2-8", "jax", "0.1.70", "0.2.0"),
    ],
)
def test_framework_too_old_every_generation(accel: str, framework: str, version: str, floor: str) -> None:
    check = validate(accel, "", framework, version)
    _problem(
        check,
        f"is older than {default_table().tpu_generations[GENERATIONS[accel][0]].label} needs (>= {floor})",
    )
    assert any(s.endswith(f">= {floor}") for s in check.suggestions)
    _ok(validate(accel, "", framework, floor))


def test_framework_max_version(tmp_path: Path) -> None:
    text = runtimes.DEFAULT_TABLE_PATH.read_text().replace('jax: {min: "0.2.0"}', 'jax: {min: "0.2.0", max: "0.4.38"}')
    path = tmp_path / "r.yaml"
    path.write_text(text)
    table = RuntimeTable.load(path)
    _problem(
        validate("v3-8", "", "jax", "0.5.0", table=table),
        "jax 0.5.0 is newer than TPU v3 supports (<= 0.4.38)",
    )
    _ok(validate("v3-8", "", "jax", "0.4.38", table=table))


def test_bad_framework_version() -> None:
    check = validate("v6e-8", "", "jax", "latest")
    _problem(check, "jax version 'latest' is not a version number")


@pytest.mark.parametrize("framework", ["caffe", "mxnet"])
def test_unknown_framework_is_a_problem_not_a_crash(framework: str) -> None:
    check = validate("v6e-8", "", framework, "1.0")
    _problem(check, f"unknown framework '{framework}' for TPU; known: jax, pytorch-xla, tensorflow, vllm-tpu")
    gpu = validate("nvidia-l4", "", framework, "1.0")
    _problem(gpu, f"unknown framework '{framework}' for GPU; known: pytorch, jax, tensorflow, vllm")


@pytest.mark.parametrize(
    ("accel", "message"),
    [
        ("v9-8", "unknown TPU accelerator type 'v9-8'; known: v6e-N (TPU v6e (Trillium))"),
        ("v5e-8", "TPU v5e types are named v5litepod-N in the TPU API"),
        ("v7x-8", "TPU7x (Ironwood) is not served by the TPU API"),
        ("tpu7x-8", "TPU7x (Ironwood) is not served by the TPU API"),
        ("v6e-0", "TPU v6e (Trillium) types are v6e-N with N the number of chips"),
        ("v5p-big", "TPU v5p types are v5p-N with N the number of TensorCores"),
        ("nvidia-rtx-4090", "unknown GPU type 'nvidia-rtx-4090'; known: nvidia-b200"),
    ],
)
def test_unknown_accelerator(accel: str, message: str) -> None:
    check = validate(accel, "", "jax")
    _problem(check, message)
    assert check.suggestions and check.suggestions[0].startswith("use one of: ")
    with pytest.raises(UnknownAcceleratorError, match="unknown|not served|named|types are"):
        if accel.startswith("nvidia-"):
            recommended_gpu_image(accel)
        else:
            recommended_runtime(accel)


def test_blank_accelerator() -> None:
    _problem(validate("", "", "jax"), "no accelerator type given")


def test_offered_runtime_versions() -> None:
    offered = ["tpu-ubuntu2204-base", "v2-alpha-tpuv5"]
    missing = validate("v6e-8", "v2-alpha-tpuv6e", "jax", offered_runtime_versions=offered)
    _problem(
        missing,
        "runtime v2-alpha-tpuv6e is not offered in this zone (offered: tpu-ubuntu2204-base, v2-alpha-tpuv5)",
    )
    assert "try another zone" in missing.suggestions
    blank = validate("v6e-8", "", "jax", offered_runtime_versions=offered)
    _problem(blank, "runtime v2-alpha-tpuv6e for v6e-8 (TPU v6e (Trillium)) is not offered in this zone")
    # the recommended one is not offered but a compatible one is: it is chosen
    tf_offered = ["tpu-vm-tf-2.14.1", "v2-alpha-tpuv6e"]
    chosen = validate("v6e-8", "", "tensorflow", offered_runtime_versions=tf_offered)
    _problem(chosen, "not offered")  # 2.14 predates v6e: nothing compatible
    v4 = validate("v4-8", "", "tensorflow", offered_runtime_versions=["tpu-vm-tf-2.17.0-pjrt"])
    _ok(v4)
    assert v4.runtime == "tpu-vm-tf-2.17.0-pjrt"
    assert "using tpu-vm-tf-2.17.0-pjrt" in v4.warnings[0]
    wrong = validate("v4-8", "tpu-ubuntu2204-base", "tensorflow", offered_runtime_versions=["tpu-vm-tf-2.17.0-pjrt"])
    assert "use tpu-vm-tf-2.17.0-pjrt" in wrong.suggestions


def test_legacy_unknown_and_gpu_image_runtimes_on_tpu() -> None:
    legacy = validate("v4-8", "tpu-vm-v4-pt-2.0", "pytorch-xla", "2.0")
    _ok(legacy)
    assert legacy.warnings == ("runtime tpu-vm-v4-pt-2.0 is a legacy runtime for TPU v4",)
    _problem(
        validate("v5litepod-8", "v2-tpuv6e-base", "jax"),
        "unknown runtime 'v2-tpuv6e-base' for v5litepod-8 (TPU v5e); use v2-alpha-tpuv5-lite",
    )
    _problem(
        validate("v6e-8", "common-cu128-ubuntu-2204-nvidia-570", "jax"),
        "looks like a GPU VM image; a TPU VM takes a runtime version; use v2-alpha-tpuv6e",
    )
    new = validate("v6e-8", "v2-alpha-tpuv6e-next", "jax", offered_runtime_versions=["v2-alpha-tpuv6e-next"])
    _ok(new)
    assert "not in the compatibility table" in new.warnings[0]


# ---------------------------------------------------------------------------------------------------
# GPUs


@pytest.mark.parametrize("gpu", GPU_TYPES)
def test_recommended_gpu_image_every_type(gpu: str) -> None:
    image = recommended_gpu_image(gpu)
    assert image == "common-cu128-ubuntu-2204-nvidia-570"
    for framework in ("pytorch", "jax", "tensorflow", "vllm"):
        check = validate(gpu, "", framework)
        _ok(check)
        assert check.runtime == image and check.kind == AcceleratorKind.GPU
    _ok(validate(gpu, image, "pytorch", "2.7.0", offered_runtime_versions=[image]))


@pytest.mark.parametrize(
    ("gpu", "image", "problem"),
    [
        (
            "nvidia-b200",
            "common-cu124-debian-11-py310",
            "image common-cu124-debian-11-py310 ships CUDA 12.4; compute capability 10.0 (blackwell) "
            "builds from CUDA 12.8",
        ),
        (
            "nvidia-h100-80gb",
            "tf-ent-2-9-cu113",
            "ships CUDA 11.3; compute capability 9.0 (hopper) builds from CUDA 11.8",
        ),
        (
            "nvidia-l4",
            "projects/deeplearning-platform-release/global/images/family/common-cu113-debian-10",
            "ships CUDA 11.3",
        ),
        (
            "nvidia-h200-141gb",
            "common-cu124-ubuntu-2204-nvidia-535",
            "ships driver 535; NVIDIA H200 is supported by NVIDIA drivers from 550",
        ),
        (
            "nvidia-tesla-t4",
            "v2-alpha-tpuv6e",
            "v2-alpha-tpuv6e is a TPU runtime version; a GPU VM boots an image",
        ),
        ("nvidia-l4", "tpu-vm-tf-2.18.0-pjrt", "is a TPU runtime version"),
    ],
)
def test_gpu_image_mismatches(gpu: str, image: str, problem: str) -> None:
    check = validate(gpu, image, "pytorch")
    _problem(check, problem)
    assert "use common-cu128-ubuntu-2204-nvidia-570" in check.suggestions


def test_gpu_framework_mismatches() -> None:
    _problem(validate("nvidia-l4", "", "vllm-tpu"), "vllm-tpu runs on TPUs only; on GPUs use vllm")
    _problem(validate("nvidia-l4", "", "pytorch-xla"), "pytorch-xla runs on TPUs only; on GPUs use pytorch")
    b200 = validate("nvidia-b200", "", "torch", "2.6.0")
    _problem(b200, "pytorch 2.6.0 is older than NVIDIA B200 (blackwell) needs (>= 2.7.0)")
    assert "framework 'torch' on GPU means 'pytorch'" in b200.warnings
    _problem(
        validate("nvidia-b200", "common-cu126-ubuntu-2204-nvidia-570", "pytorch", "2.7.0"),
        "pytorch on blackwell needs CUDA >= 12.8",
    )
    _problem(validate("nvidia-h100-80gb", "", "pytorch", "1.13.1"), "older than NVIDIA H100 80GB (hopper) needs")
    _ok(validate("nvidia-tesla-t4", "", "pytorch", "1.13.1"))
    _ok(validate("nvidia-tesla-t4", "", "vllm", "0.6.0", python_version="3.10"))
    _problem(validate("nvidia-l4", "", "vllm", "0.6.0", python_version="3.8"), "vllm needs Python >= 3.9")


def test_gpu_min_compute_capability(tmp_path: Path) -> None:
    text = runtimes.DEFAULT_TABLE_PATH.read_text().replace(
        'min_compute_capability: "7.0"', 'min_compute_capability: "8.0"'
    )
    path = tmp_path / "r.yaml"
    path.write_text(text)
    check = validate("nvidia-tesla-t4", "", "vllm", table=RuntimeTable.load(path))
    _problem(check, "vllm needs compute capability >= 8.0; NVIDIA T4 has 7.5")


def test_gpu_image_name_without_cuda_and_offered_images() -> None:
    custom = validate("nvidia-l4", "projects/acme/global/images/trainer-v3", "pytorch")
    _ok(custom)
    assert "cannot tell the CUDA version of image projects/acme/global/images/trainer-v3" in custom.warnings[0]
    _problem(
        validate(
            "nvidia-l4",
            "common-cu128-ubuntu-2204-nvidia-570",
            "pytorch",
            offered_runtime_versions=["common-cu124-debian-11"],
        ),
        "image common-cu128-ubuntu-2204-nvidia-570 is not offered",
    )
    _problem(
        validate("nvidia-l4", "", "pytorch", offered_runtime_versions=[]),
        "recommended image common-cu128-ubuntu-2204-nvidia-570 is not offered",
    )


@pytest.mark.parametrize(
    ("image", "cuda", "driver"),
    [
        ("common-cu128-ubuntu-2204-nvidia-570", "12.8", 570),
        ("common-cu124-debian-11-py310", "12.4", 550),
        ("pytorch-2-7-cu128-ubuntu-2204-nvidia-570", "12.8", 570),
        ("projects/x/global/images/family/common-cu121-debian-11", "12.1", 530),
        ("common-cu118-debian-11", "11.8", 520),
        ("common-cu125-debian-11", "12.5", 555),  # CUDA 12.5's own floor (NVIDIA's table 3)
        ("common-cu126-debian-11", "12.6", 560),
        ("my-image", None, None),
    ],
)
def test_image_cuda_driver(image: str, cuda: str | None, driver: int | None) -> None:
    assert image_cuda_driver(image) == (cuda, driver)


# ---------------------------------------------------------------------------------------------------
# The table itself


def test_table_covers_what_the_rest_of_the_code_names() -> None:
    table = default_table()
    assert set(GPU_QUOTA_METRICS) <= set(table.gpu_types)
    for machine, (gpu, _) in GPU_MACHINE_TYPES.items():
        assert machine in table.gpu_types[gpu].machine_types, machine
    for cand in (*DEFAULT_GPU_CANDIDATES, *DEFAULT_SMALLER_GPUS):
        assert cand.machine_type in table.gpu_types[cand.accelerator_type].machine_types
    for cand in DEFAULT_TPU_CANDIDATES:
        _ok(validate(cand.accelerator_type, "", "jax"))
    for gen in table.tpu_generations.values():
        assert gen.recommended_runtime in gen.runtimes


def test_runtime_check_round_trip_and_message() -> None:
    check = validate("v5litepod-8", "v2-alpha-tpuv6e", "jax", "0.4.35")
    again = RuntimeCheck.from_dict(json.loads(json.dumps(check.to_dict())))
    assert again == check
    lines = check.message().splitlines()
    assert lines[0] == "NOT OK: v5litepod-8 (TPU v5e) with v2-alpha-tpuv6e, jax 0.4.35"
    assert lines[1].startswith("  problem: runtime v2-alpha-tpuv6e does not run on v5litepod-8")
    assert lines[-1] == "  instead: use v2-alpha-tpuv5-lite"
    assert validate("v6e-8").message() == "OK: v6e-8 (TPU v6e (Trillium)) with v2-alpha-tpuv6e"


def test_table_load_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RuntimeTableError, match="cannot read runtime table"):
        RuntimeTable.load(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(RuntimeTableError, match="is not a mapping"):
        RuntimeTable.load(tmp_path / "list.yaml")
    (tmp_path / "partial.yaml").write_text("tpu: {generations: {}}\n")
    with pytest.raises(RuntimeTableError, match="malformed runtime table: KeyError"):
        RuntimeTable.load(tmp_path / "partial.yaml")
    bad = runtimes.DEFAULT_TABLE_PATH.read_text().replace('jax: {min: "0.4.35"}', 'jax: {min: "soon"}')
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(RuntimeTableError, match="v6e, jax.*bad version 'soon'"):
        RuntimeTable.load(tmp_path / "bad.yaml")
    # the environment variable points the default table elsewhere
    edited = (
        runtimes.DEFAULT_TABLE_PATH.read_text()
        .replace("recommended_runtime: v2-alpha-tpuv6e", "recommended_runtime: v2-alpha-tpuv6e-next")
        .replace("runtimes: [v2-alpha-tpuv6e]", "runtimes: [v2-alpha-tpuv6e, v2-alpha-tpuv6e-next]")
    )
    (tmp_path / "edited.yaml").write_text(edited)
    monkeypatch.setenv(runtimes.TABLE_ENV, str(tmp_path / "edited.yaml"))
    assert recommended_runtime("v6e-8") == "v2-alpha-tpuv6e-next"
    monkeypatch.delenv(runtimes.TABLE_ENV)
    assert recommended_runtime("v6e-8") == "v2-alpha-tpuv6e"


def test_tpu_type_hosts() -> None:
    # https://cloud.google.com/tpu/docs/v6e and /v5e: up to 8 chips on one host, multi-host slices on
    # 4-chip hosts
    assert parse_tpu_type("v6e-8").hosts == 1 and not parse_tpu_type("v6e-8").multi_host
    assert parse_tpu_type("v6e-16").hosts == 4
    assert parse_tpu_type("v6e-256").hosts == 64
    assert parse_tpu_type("v5litepod-16").hosts == 4
    assert parse_tpu_type("v5litepod-8").hosts == 1
    assert parse_tpu_type("v5p-8").hosts == 1 and parse_tpu_type("v5p-16").hosts == 2
    assert parse_tpu_type("v5litepod-4").hosts == 1
    assert parse_tpu_type("v4-32").hosts == 4
    assert parse_tpu_type(" v5p-8 ").describe() == "v5p-8 (TPU v5p)"


def test_every_row_names_a_public_source() -> None:
    """Each row cites a page a user can open (never a file outside the repository)."""
    import yaml

    raw = yaml.safe_load(runtimes.DEFAULT_TABLE_PATH.read_text())
    table = default_table()
    sources = [table.tensorflow.source, raw["tpu"]["system_python_source"], raw["gpu"]["cuda_min_driver_source"]]
    sources += [g.source for g in table.tpu_generations.values()]
    sources += [t.source for t in table.gpu_types.values()]
    sources += [r.source for r in table.gpu_frameworks.values()]
    sources += [r.source for g in table.tpu_generations.values() for r in g.frameworks.values() if r.note]
    for source in sources:
        assert source and source.startswith("https://"), source
    assert "/work/" not in runtimes.DEFAULT_TABLE_PATH.read_text()
