"""plan(): what plan_only shows is what deploy applies; a bad image tag stops it before anything is applied."""

from __future__ import annotations

import pytest

from interlude.serving.plan import ServingPlanError, plan, require_plan
from interlude.serving.render import render_all, to_yaml
from interlude.serving.spec import ServeSpec

SPEC = ServeSpec(checkpoint_uri="gs://interlude-local/interlude/run-1/finetune/step-00000030/")


def test_the_plan_is_the_rendered_objects_and_their_text() -> None:
    result = require_plan(SPEC)
    assert result.ok and list(result.objects) == render_all(SPEC) and result.text == to_yaml(render_all(SPEC))
    assert plan(SPEC, "gpu_first").objects[0]["spec"]["priorities"][0]["gpu"]["type"] == "nvidia-l4"


def test_a_bad_image_tag_is_refused_with_every_problem() -> None:
    bad = SPEC.replace(tpu_image="docker.io/vllm/vllm-tpu:v0.0.1", gpu_image="docker.io/vllm/vllm-openai:nightly")
    assert not plan(bad).ok
    with pytest.raises(ServingPlanError) as info:
        require_plan(bad)
    assert [p.split(":")[1].strip() for p in info.value.problems] == ["tpu_image", "gpu_image"]


def test_an_old_driver_is_refused() -> None:
    with pytest.raises(ServingPlanError, match="gpu_driver_version: driver 470.57.02 cannot run CUDA 12.8"):
        require_plan(SPEC, gpu_driver="470.57.02")
