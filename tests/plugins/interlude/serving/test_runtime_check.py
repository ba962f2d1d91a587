"""Runtime check: each row of the table decides; a bad image tag is refused naming the param."""

from __future__ import annotations

from pathlib import Path

import pytest

from interlude.serving.runtime_check import RuntimeCheckError, check_runtimes, require_runtimes
from interlude.serving.spec import ServeSpec, ServeSpecError
from interlude.serving.tables import DEFAULT_TABLE_PATH, load_table

CKPT = "gs://interlude-local/interlude/run-1/finetune/step-00000030/"
BASE = ServeSpec(checkpoint_uri=CKPT)


def test_the_defaults_pass_with_no_finding() -> None:
    report = require_runtimes(BASE)
    assert report.findings == () and report.tpu_generation == "v6e" and report.gpu_cuda == "12.8"


@pytest.mark.parametrize(
    ("tag", "tpu_type", "severity"),
    [
        ("v0.11.1", "v6e-8", None),
        ("v0.11.1", "v5litepod-4", None),
        ("v0.11.1", "v5p-8", "error"),  # v0.11.1's quickstart lists v6e and v5e only
        ("v0.12.0", "v4-8", "warning"),
        ("2e33fe419186c65a18da6668972d61d7bbc31564", "v6e-1", None),
        ("v0.27.0", "v6e-4", None),
        ("v0.27.0", "v5p-8", "warning"),
    ],
)
def test_vllm_tpu_image_against_the_generation(tag: str, tpu_type: str, severity: str | None) -> None:
    report = check_runtimes(BASE.replace(tpu_image=f"docker.io/vllm/vllm-tpu:{tag}", tpu_type=tpu_type))
    tpu = [f for f in report.findings if f.param == "tpu_image"]
    assert [f.severity for f in tpu] == ([] if severity is None else [severity])
    assert report.ok == (severity != "error")


def test_a_generation_the_release_does_not_list_is_refused(tmp_path: Path) -> None:
    text = DEFAULT_TABLE_PATH.read_text()
    narrowed = text.replace(
        "recommended: [v5e, v6e]\n      experimental: []", "recommended: [v5e]\n      experimental: []", 1
    )
    path = tmp_path / "t.yaml"
    path.write_text(narrowed)
    report = check_runtimes(
        BASE.replace(tpu_type="v6e-8", tpu_image="docker.io/vllm/vllm-tpu:v0.11.1"), load_table(path)
    )
    assert report.errors() == [
        "error: tpu_image: docker.io/vllm/vllm-tpu:v0.11.1 does not support TPU v6e (compatible: v5e) "
        "(source: https://github.com/vllm-project/tpu-inference/blob/v0.11.1/docs/getting_started/quickstart.md)"
    ]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("docker.io/vllm/vllm-tpu:v9.9.9", "tpu_image: tag 'v9.9.9' of docker.io/vllm/vllm-tpu is not a known release"),
        ("docker.io/vllm/vllm-tpu@sha256:" + "b" * 64, "tpu_image: tag '(digest only)'"),
        ("ghcr.io/someone/vllm-tpu:v0.11.1", "tpu_image: ghcr.io/someone/vllm-tpu is not a known vLLM TPU image"),
    ],
)
def test_unknown_tpu_images_are_refused_naming_the_param(image: str, expected: str) -> None:
    with pytest.raises(RuntimeCheckError) as info:
        require_runtimes(BASE.replace(tpu_image=image))
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("image", "cuda"),
    [
        ("docker.io/vllm/vllm-openai:v0.11.0", "12.8"),
        ("vllm/vllm-openai:v0.7.3", "12.4"),
        ("vllm/vllm-openai:v0.28.0-cu129", "12.9"),
        ("vllm/vllm-openai:v0.28.0-cu130", "13.0"),
        ("vllm/vllm-openai:v0.26.0-cu129-ubuntu2404", "12.9"),
    ],
)
def test_cuda_of_the_gpu_image(image: str, cuda: str) -> None:
    assert check_runtimes(BASE.replace(gpu_image=image)).gpu_cuda == cuda


@pytest.mark.parametrize(
    ("image", "driver", "severity", "expected"),
    [
        ("vllm/vllm-openai:v0.11.0", "570.26", None, ""),
        ("vllm/vllm-openai:v0.11.0", "570.172.08", None, ""),
        ("vllm/vllm-openai:v0.11.0", "535.230.02", "error", "driver 535.230.02 cannot run CUDA 12.8 (needs >= 570.26;"),
        ("vllm/vllm-openai:v0.28.0-cu129", "535.230.02", "error", "cannot run CUDA 12.9 (needs >= 575.51.03;"),
        ("vllm/vllm-openai:v0.11.0", "470.256.02", "error", "driver 470.256.02 cannot run CUDA 12.8 (needs >= 570.26;"),
        ("vllm/vllm-openai:v0.28.0-cu130", "570.172.08", "error", "cannot run CUDA 13.0 (needs >= 580.65.06;"),
        ("vllm/vllm-openai:v0.28.0-cu130", "580.65.06", None, ""),
        ("vllm/vllm-openai:v0.28.0-cu125", "555.42.02", None, ""),
        ("vllm/vllm-openai:v0.28.0-cu125", "550.54.14", "error", "cannot run CUDA 12.5 (needs >= 555.42.02;"),
        ("vllm/vllm-openai:v0.7.3", "550.54.14", None, ""),
        ("vllm/vllm-openai:v0.7.3", "525.60.13", "error", "cannot run CUDA 12.4 (needs >= 550.54.14;"),
        ("vllm/vllm-openai:v0.7.3", "not-a-version", "error", "'not-a-version' is not a driver version"),
    ],
)
def test_gpu_driver_against_cuda(image: str, driver: str, severity: str | None, expected: str) -> None:
    report = check_runtimes(BASE.replace(gpu_image=image), gpu_driver=driver)
    findings = [f for f in report.findings if f.param == "gpu_driver_version"]
    assert [f.severity for f in findings] == ([] if severity is None else [severity])
    assert all(expected in f.message for f in findings)


def test_driver_channels_come_from_the_table() -> None:
    latest = check_runtimes(BASE.replace(gpu_driver_version="latest"))
    default = check_runtimes(BASE.replace(gpu_driver_version="default"))
    assert latest.gpu_driver == load_table().driver_channels["latest"] and latest.warnings() == []
    assert default.gpu_driver == load_table().driver_channels["default"]
    assert [f.param for f in default.findings] == ["gpu_driver_version"]


@pytest.mark.parametrize(
    ("gpu_type", "gpu_count", "image", "expected"),
    [
        ("nvidia-b200", 8, "vllm/vllm-openai:v0.7.3", "CUDA 12.4 does not build for nvidia-b200"),
        ("nvidia-b200", 8, "vllm/vllm-openai:v0.11.0", None),
        ("nvidia-h100-80gb", 1, "vllm/vllm-openai:v0.7.3", None),
        ("nvidia-tesla-t4", 1, "vllm/vllm-openai:v0.11.0", None),
    ],
)
def test_gpu_type_compute_capability(gpu_type: str, gpu_count: int, image: str, expected: str | None) -> None:
    report = check_runtimes(BASE.replace(gpu_type=gpu_type, gpu_count=gpu_count, gpu_image=image))
    errors = [e for e in report.errors() if "gpu_image" in e or "gpu_type" in e]
    assert errors == [] if expected is None else any(expected in e for e in errors)


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("vllm/vllm-openai:nightly", "gpu_image: tag 'nightly' of docker.io/vllm/vllm-openai is not a known release"),
        ("vllm/vllm-openai:v0.11.0-rc1", "gpu_image: tag 'v0.11.0-rc1'"),
        ("nvcr.io/nvidia/vllm:25.01", "gpu_image: nvcr.io/nvidia/vllm is not a known vLLM GPU image repository"),
    ],
)
def test_a_bad_gpu_image_tag_is_refused_before_anything_is_applied(image: str, expected: str) -> None:
    with pytest.raises(RuntimeCheckError) as info:
        require_runtimes(BASE.replace(gpu_image=image))
    assert expected in str(info.value)


def test_every_image_row_cites_a_public_source() -> None:
    table = load_table()
    for row in table.tpu_images.values():
        assert row.source.startswith("https://"), row
    for cuda, source in table.gpu_image_cuda.values():
        assert source.startswith("https://github.com/vllm-project/vllm/blob/") and cuda in table.toolkit_min_driver


def test_an_unchecked_spec_with_an_unknown_accelerator_is_refused_naming_the_param() -> None:
    with pytest.raises(ServeSpecError, match="tpu_type: 'v9-1'"):
        check_runtimes(BASE.replace(tpu_type="v9-1"))
    with pytest.raises(ServeSpecError, match="gpu_type: 'nvidia-x'"):
        check_runtimes(BASE.replace(gpu_type="nvidia-x"))
