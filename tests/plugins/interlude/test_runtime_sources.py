"""The runtime table against its public sources (issue 32, item 4): each test states a fact from a page.

The expected values are copied from the pages named in each test, not from
``plugins/interlude/runtimes/runtimes.yaml``, so
a table that drifts from Google's, vLLM's or NVIDIA's own words turns a test red.
"""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
import yaml

from interlude.runtimes import DEFAULT_TABLE_PATH, RuntimeCheck, UnknownAcceleratorError, parse_tpu_type, validate
from interlude.runtimes.tpu import recommended_runtime


def _ok(check: RuntimeCheck) -> None:
    assert check.ok, check.message()


def _problem(check: RuntimeCheck, text: str) -> None:
    assert not check.ok, check.message()
    assert any(text in p for p in check.problems), check.message()


# https://cloud.google.com/tpu/docs/runtimes, "TPU v4": "If you're using TensorFlow 2.10.0 or earlier, use a
# v4-specific TPU software version" - the table lists 2.10.0, 2.9.3, 2.9.2 and 2.9.1, each with -pod-v4.
@pytest.mark.parametrize(
    ("accel", "runtime", "version"),
    [("v4-8", "tpu-vm-tf-2.9.1-v4", "2.9.1"), ("v4-32", "tpu-vm-tf-2.9.1-pod-v4", "2.9.1")],
)
def test_tensorflow_2_9_1_on_v4(accel: str, runtime: str, version: str) -> None:
    _ok(validate(accel, runtime, "tensorflow", version))
    check = validate(accel, "", "tensorflow", version)
    _ok(check)
    assert check.runtime == runtime


# Same page, "TPU v2 and v3" (and v4 from TF 2.10.1): tpu-vm-tf-x.y.z[-pod], and from TF 2.15.0 the device
# API in the name, -pjrt or -se, for every release of its TensorFlow table (2.18.0, 2.17.x included).
@pytest.mark.parametrize("accel", ["v2-8", "v3-8", "v4-8"])
@pytest.mark.parametrize("runtime", ["tpu-vm-tf-2.18.0-pjrt", "tpu-vm-tf-2.18.0-se", "tpu-vm-tf-2.17.0-se"])
def test_rule_names_single_host_v2_to_v4(accel: str, runtime: str) -> None:
    _ok(validate(accel, runtime, "tensorflow"))


@pytest.mark.parametrize("accel", ["v2-32", "v3-32", "v4-16"])
@pytest.mark.parametrize("runtime", ["tpu-vm-tf-2.18.0-pod-pjrt", "tpu-vm-tf-2.18.0-pod-se", "tpu-vm-tf-2.17.1-pod-se"])
def test_rule_names_multi_host_v2_to_v4(accel: str, runtime: str) -> None:
    _ok(validate(accel, runtime, "tensorflow"))


def test_rule_names_on_v5e_v5p_v6e_are_pjrt() -> None:
    # "TPU v6e, v5e, and v5p support TensorFlow 2.15.0 and newer ... tpu-vm-tf-x.y.z-{pod}-pjrt"
    for accel in ("v6e-8", "v5litepod-8", "v5p-8"):
        _ok(validate(accel, "tpu-vm-tf-2.18.0-pjrt", "tensorflow"))
        _problem(validate(accel, "tpu-vm-tf-2.17.1-se", "tensorflow"), "device API -se is not used")
        assert recommended_runtime(accel, "tensorflow") == "tpu-vm-tf-2.18.0-pjrt"


def test_hardware_suffixed_names_stay_accepted_where_they_fit() -> None:
    # the exception, not the rule: still accepted on the hardware they name (zones list them)
    _ok(validate("v6e-8", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", "tensorflow"))
    _ok(validate("v4-8", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below", "tensorflow"))
    _problem(validate("v6e-8", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below", "tensorflow"), "built for v5p-and-below")


# vLLM's own TPU docs: v0.5.x "TPU versions: v5e, v5p, v4" (https://docs.vllm.ai/en/v0.5.1/getting_started/
# tpu-installation.html); v0.6.3 still "v5e, v5p, v4"; v0.6.4 "v6e, v5e, v5p, v4" (…/v0.6.4/…).
@pytest.mark.parametrize(("accel", "first", "before"), [("v5litepod-8", "0.5.0", "0.4.3"), ("v6e-8", "0.6.4", "0.6.3")])
def test_vllm_tpu_floors(accel: str, first: str, before: str) -> None:
    _ok(validate(accel, "", "vllm-tpu", first, python_version="3.10"))  # those docs: Python 3.10
    _problem(validate(accel, "", "vllm-tpu", before, python_version="3.10"), f"(>= {first})")
    # tpu-inference's v0.11.1 quickstart: "Python: 3.11 or newer"
    _problem(validate(accel, "", "vllm-tpu", "0.11.1", python_version="3.10"), "needs Python >= 3.11")


# Published slice sizes: https://cloud.google.com/tpu/docs/v5e (v5litepod-1, 4, 8, 16, 32, 64, 128, 256) and
# https://cloud.google.com/tpu/docs/v6e (v6e-1, 4, 8, 16, 32, 64, 128, 256).
@pytest.mark.parametrize("accel", ["v5litepod-2", "v6e-12", "v6e-2", "v5litepod-12", "v2-16", "v3-16", "v4-24"])
def test_unpublished_slice_sizes_are_refused_naming_the_param(accel: str) -> None:
    with pytest.raises(
        UnknownAcceleratorError, match=rf"accelerator_type '{accel}' is not a .* slice Google publishes"
    ):
        parse_tpu_type(accel)
    _problem(validate(accel, "", "jax"), f"accelerator_type '{accel}'")


@pytest.mark.parametrize(
    "accel",
    ["v5litepod-1", "v5litepod-4", "v5litepod-256", "v6e-1", "v6e-4", "v6e-256", "v5p-8", "v5p-128", "v5p-12288"]
    + ["v4-8", "v4-64", "v4-128", "v4-4096", "v3-2048", "v2-512"],
)
def test_published_slice_sizes_are_accepted(accel: str) -> None:
    _ok(validate(accel, "", "jax"))


# NVIDIA CUDA Toolkit release notes, table 3 (minimum required driver of each GA release): 12.5 GA
# >= 555.42.02, 13.0 GA >= 580.65.06 - branches 555 and 580.
@pytest.mark.parametrize(("image", "cuda", "driver"), [("common-cu125-ubuntu-2204", "12.5", 555)])
def test_cuda_12_5_floor(image: str, cuda: str, driver: int) -> None:
    from interlude.runtimes import image_cuda_driver

    assert image_cuda_driver(image) == (cuda, driver)


def test_cuda_13_0_floor() -> None:
    from interlude.runtimes import image_cuda_driver

    assert image_cuda_driver("common-cu130-ubuntu-2404") == ("13.0", 580)


# H200 and H100 Mega are Hopper (compute capability 9.0, built by CUDA from 11.8); what the H200 needs is
# NVIDIA's R550 driver (NVIDIA's MIG guide, minimum drivers: H100 R525, H200 R550, B200 R570).
def test_hopper_cuda_floor_is_11_8_and_h200_needs_r550() -> None:
    for gpu in ("nvidia-h200-141gb", "nvidia-h100-mega-80gb"):
        _ok(validate(gpu, "common-cu121-ubuntu-2204-nvidia-550", "pytorch", "2.2.0"))
    _problem(
        validate("nvidia-h200-141gb", "common-cu121-ubuntu-2204-nvidia-535", "pytorch"),
        "NVIDIA H200 is supported by NVIDIA drivers from 550",
    )
    _ok(validate("nvidia-h100-mega-80gb", "common-cu121-ubuntu-2204-nvidia-535", "pytorch", "2.2.0"))
    _problem(validate("nvidia-b200", "common-cu128-ubuntu-2204-nvidia-560", "pytorch"), "from 570")


_ALLOWED_SOURCE_HOSTS = {
    "cloud.google.com",
    "docs.vllm.ai",
    "docs.nvidia.com",
    "developer.nvidia.com",
    "pytorch.org",
    "docs.jax.dev",
    "www.tensorflow.org",
    "github.com",
}


def _sources(node: object) -> list[str]:
    """Every https URL in the file's values (sources and notes)."""
    if isinstance(node, dict):
        return [u for v in node.values() for u in _sources(v)]
    if isinstance(node, list):
        return [u for v in node for u in _sources(v)]
    return [node] if isinstance(node, str) and node.startswith("https://") else []


def test_every_source_is_an_official_page() -> None:
    raw = yaml.safe_load(DEFAULT_TABLE_PATH.read_text())
    urls = _sources(raw)
    assert urls
    for url in urls:
        parsed = urlparse(url)
        assert parsed.hostname in _ALLOWED_SOURCE_HOSTS, url
        if parsed.hostname == "github.com":  # only the projects' own repositories, never a fork
            assert parsed.path.split("/")[1] in {"vllm-project", "GoogleCloudPlatform", "AI-Hypercomputer"}, url
