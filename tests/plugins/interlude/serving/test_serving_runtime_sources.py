"""The serving table against its public sources (issue 32, item 4).

Expected values come from the pages named here, not from
``plugins/interlude/serving/serving_runtimes.yaml``: the release
list of vLLM TPU (https://github.com/vllm-project/tpu-inference/releases), each release's own README or
quickstart, Google's TPU7x and GKE pages, NVIDIA's driver tables.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
import yaml

from interlude.serving.runtime_check import RuntimeCheckError, check_runtimes, require_runtimes
from interlude.serving.spec import ServeSpec
from interlude.serving.tables import DEFAULT_TABLE_PATH, load_table

CKPT = "gs://interlude-local/interlude/run-1/finetune/step-00000030/"
BASE = ServeSpec(checkpoint_uri=CKPT)
TPU_IMAGE = "docker.io/vllm/vllm-tpu:{}"

# git tags of vllm-project/tpu-inference (its releases); there is no v0.22.0
PUBLISHED = ["v0.11.1", "v0.12.0", "v0.13.2", "v0.18.0", "v0.19.0", "v0.20.0", "v0.21.0", "v0.22.1"] + [
    "v0.23.0",
    "v0.24.0",
    "v0.25.0",
    "v0.26.0",
    "v0.27.0",
]


def test_the_tag_googles_trillium_recipe_pins_serves_on_v6e() -> None:
    # AI-Hypercomputer/tpu-recipes, inference/trillium/vLLM: vllm/vllm-tpu:v0.12.0; its README: "Recommended: v5e, v6e"
    for tpu_type in ("v6e-1", "v6e-4", "v6e-8"):
        report = require_runtimes(BASE.replace(tpu_image=TPU_IMAGE.format("v0.12.0"), tpu_type=tpu_type))
        assert [f for f in report.findings if f.param == "tpu_image"] == []


@pytest.mark.parametrize("tag", PUBLISHED)
def test_every_published_release_is_known(tag: str) -> None:
    report = check_runtimes(BASE.replace(tpu_image=TPU_IMAGE.format(tag), tpu_type="v6e-8"))
    assert report.ok, report.errors()


def test_a_release_that_does_not_exist_is_refused() -> None:
    with pytest.raises(RuntimeCheckError, match="tpu_image: tag 'v0.22.0' of docker.io/vllm/vllm-tpu is not a known"):
        require_runtimes(BASE.replace(tpu_image=TPU_IMAGE.format("v0.22.0")))


def test_each_release_row_cites_that_release() -> None:
    for tag, row in load_table().tpu_images.items():
        if tag.startswith("v"):
            assert f"/vllm-project/tpu-inference/blob/{tag}/" in row.source, (tag, row.source)


def test_ironwood_serving_shape() -> None:
    # https://cloud.google.com/tpu/docs/tpu7x: 4 chips per VM (tpu7x-8, machine type tpu7x-standard-4t, 2x2x1);
    # GKE label cloud.google.com/gke-tpu-accelerator=tpu7x; tpu-inference lists v7x from v0.18.0
    shape = load_table().tpu_shapes["tpu7x-8"]
    assert (shape.chips, shape.topology, shape.machine_type, shape.gke_accelerator) == (
        4,
        "2x2x1",
        "tpu7x-standard-4t",
        "tpu7x",
    )
    ok = check_runtimes(BASE.replace(tpu_type="tpu7x-8", tpu_image=TPU_IMAGE.format("v0.18.0")))
    assert ok.ok and ok.tpu_generation == "v7x", ok.errors()
    old = check_runtimes(BASE.replace(tpu_type="tpu7x-8", tpu_image=TPU_IMAGE.format("v0.13.2")))
    assert any("does not support TPU v7x" in e for e in old.errors()), old.errors()


@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.11.0", "vllm/vllm-openai:v0.28.0-cu129"])
def test_cuda_12_8_and_12_9_on_a_535_driver_are_refused(image: str) -> None:
    # NVIDIA table 3: 12.8 needs >= 570.26, 12.9 >= 575.51.03; vLLM's PTX JIT fails below (no minor-compat path)
    report = check_runtimes(BASE.replace(gpu_image=image), gpu_driver="535.230.02")
    assert not report.ok
    assert [f.severity for f in report.findings if f.param == "gpu_driver_version"] == ["error"]


def test_gke_picks_the_driver_per_gpu_type() -> None:
    # B200 needs NVIDIA R570 (NVIDIA's minimum drivers: B200 570.133.20): on the "default" channel GKE does
    # not give a B200 node the channel's 535 branch
    b200 = check_runtimes(BASE.replace(gpu_type="nvidia-b200", gpu_count=8, gpu_driver_version="default"))
    assert b200.ok, b200.errors()
    assert int(str(b200.gpu_driver).split(".")[0]) >= 570
    l4 = check_runtimes(BASE.replace(gpu_type="nvidia-l4", gpu_driver_version="default"))
    assert int(str(l4.gpu_driver).split(".")[0]) == 535 and not l4.ok  # CUDA 12.8 image on R535: refused


def test_a_driver_that_does_not_support_the_gpu_is_refused() -> None:
    report = check_runtimes(
        BASE.replace(gpu_type="nvidia-b200", gpu_count=8, gpu_image="vllm/vllm-openai:v0.28.0-cu125"),
        gpu_driver="560.35.03",
    )
    assert any("driver 560.35.03 does not support nvidia-b200" in e for e in report.errors()), report.errors()
    h200 = check_runtimes(
        BASE.replace(gpu_type="nvidia-h200-141gb", gpu_count=8, gpu_image="vllm/vllm-openai:v0.7.3"),
        gpu_driver="535.230.02",
    )
    assert any("does not support nvidia-h200-141gb" in e for e in h200.errors()), h200.errors()


@pytest.mark.parametrize("gpu_type", ["nvidia-h200-141gb", "nvidia-h100-mega-80gb"])
def test_hopper_builds_from_cuda_11_8(gpu_type: str) -> None:
    # compute capability 9.0 is built by CUDA 11.8 on; an H200 needs a newer driver, not a newer CUDA
    report = check_runtimes(BASE.replace(gpu_type=gpu_type, gpu_count=8, gpu_image="vllm/vllm-openai:v0.6.6-cu121"))
    assert [e for e in report.errors() if "gpu_image" in e] == []


def test_no_source_is_a_personal_fork() -> None:
    text = DEFAULT_TABLE_PATH.read_text()
    urls = re.findall(r"https://[^\s)\"'>,}]+", text)
    assert urls
    for url in urls:
        parsed = urlparse(url)
        if parsed.hostname == "github.com":
            assert parsed.path.split("/")[1] in {"vllm-project", "AI-Hypercomputer", "GoogleCloudPlatform"}, url
        else:
            # discuss.google.dev: Google Cloud's developer community blog (the TPU streamer's announcement)
            hosts = {
                "cloud.google.com",
                "docs.vllm.ai",
                "docs.nvidia.com",
                "developer.nvidia.com",
                "discuss.google.dev",
            }
            assert parsed.hostname in hosts, url
    yaml.safe_load(text)  # still one parseable document


def test_v0_11_1_cites_the_page_that_lists_its_generations() -> None:
    # v0.11.1's README has no "Compatible TPU Generations"; its quickstart says "TPU versions: v6e, v5e"
    row = load_table().tpu_images["v0.11.1"]
    assert row.source.endswith("/v0.11.1/docs/getting_started/quickstart.md")
    assert (sorted(row.recommended), row.experimental) == (["v5e", "v6e"], ())
