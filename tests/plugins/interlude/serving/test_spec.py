"""ServeSpec: one default per param, every refusal names its param, the form matches, JSON round trip."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest

from interlude.serving.images import parse_image
from interlude.serving.spec import ServeSpec, ServeSpecError, checkpoint_problem
from interlude.serving.tables import load_table

CKPT = "gs://interlude-local/interlude/run-1/finetune/step-00000030/"


def _refused(**params: object) -> str:
    with pytest.raises(ServeSpecError) as info:
        ServeSpec.from_params(params)
    return str(info.value)


def test_defaults_with_a_checkpoint_are_valid() -> None:
    spec = ServeSpec.from_params({"checkpoint_uri": CKPT})
    assert spec == ServeSpec(checkpoint_uri=CKPT)
    assert spec.tpu_shape().topology == "1x1"


def test_the_asset_event_supplies_the_checkpoint_and_an_explicit_param_wins() -> None:
    assert ServeSpec.from_params({}, checkpoint_uri=CKPT).checkpoint_uri == CKPT
    other = "gs://other-bucket/ckpt/step-1/"
    assert ServeSpec.from_params({"checkpoint_uri": other}, checkpoint_uri=CKPT).checkpoint_uri == other
    assert ServeSpec.from_params({"checkpoint_uri": ""}, checkpoint_uri=CKPT).checkpoint_uri == CKPT


def test_no_checkpoint_is_refused_except_for_delete() -> None:
    assert "checkpoint_uri: no checkpoint given" in _refused()
    assert ServeSpec.from_params({"action": "delete"}).checkpoint_uri is None


def test_the_form_is_generated_from_the_spec() -> None:
    form = ServeSpec.form_schema()
    assert set(form) == set(ServeSpec.param_names()) == {f.name for f in dataclasses.fields(ServeSpec)}
    for name, (default, schema) in form.items():
        value = getattr(ServeSpec(), name)
        assert default == (list(value) if isinstance(value, tuple) else value), name
        assert schema["description"], name
        if default is None:
            assert schema["type"] == ["null", "string"], name
        json.dumps(default)  # the form's defaults are JSON


def test_json_round_trip() -> None:
    spec = ServeSpec(checkpoint_uri=CKPT, tpu_type="v5litepod-8", tpu_nodepools=("tpu-a", "tpu-b"), plan_only=True)
    assert ServeSpec.from_json(spec.to_json()) == spec
    assert ServeSpec.from_dict(spec) is spec
    assert json.loads(spec.to_json())["tpu_nodepools"] == ["tpu-a", "tpu-b"]


def test_digest_ignores_action_plan_only_and_timing_but_not_what_is_rendered() -> None:
    spec = ServeSpec(checkpoint_uri=CKPT)
    assert spec.digest() == spec.replace(action="update", plan_only=True, poll_seconds=3.0).digest()
    assert spec.digest() != spec.replace(checkpoint_uri=CKPT + "x/").digest()
    assert spec.digest() != spec.replace(replicas_max=5).digest()


@pytest.mark.parametrize(
    ("tpu_type", "topology"),
    [
        ("v6e-1", "1x1"),
        ("v6e-4", "2x2"),
        ("v6e-8", "2x4"),
        ("v5litepod-1", "1x1"),
        ("v5litepod-4", "2x2"),
        ("v5litepod-8", "2x4"),
        ("v5p-8", "2x2x1"),
        ("v4-8", "2x2x1"),
    ],
)
def test_tpu_type_and_topology_agree(tpu_type: str, topology: str) -> None:
    spec = ServeSpec.from_params({"checkpoint_uri": CKPT, "tpu_type": tpu_type, "tpu_topology": topology})
    assert spec.tpu_shape().topology == topology
    assert ServeSpec.from_params({"checkpoint_uri": CKPT, "tpu_type": tpu_type}).tpu_shape().topology == topology


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"tpu_type": "v6e-8", "tpu_topology": "2x2"}, "tpu_topology: '2x2' does not match tpu_type v6e-8"),
        ({"tpu_type": "v6e-16"}, "tpu_type: 'v6e-16' is not a single-host TPU type"),
        ({"tpu_type": "v5e-4"}, "tpu_type: 'v5e-4'"),
        ({"tpu_topology": "2by4"}, "tpu_topology: '2by4' is not a topology"),
        ({"gpu_type": "nvidia-rtx-4090"}, "gpu_type: 'nvidia-rtx-4090' is not a known GKE GPU type"),
        ({"gpu_type": "nvidia-l4", "gpu_count": 3}, "gpu_count: nvidia-l4 nodes come with 1, 2, 4, 8 GPUs"),
        ({"replicas_min": 3, "replicas_max": 2}, "replicas_min: must not exceed replicas_max (3 > 2)"),
        ({"replicas_min": 0}, "replicas_min: must be at least 1"),
        ({"replicas_max": 65}, "replicas_max: must be at most 64"),
        ({"replicas_max": "four"}, "replicas_max: expected a whole number"),
        ({"action": "redeploy"}, "action: 'redeploy' is not one of deploy, update, delete"),
        ({"service_type": "NodePort"}, "service_type: 'NodePort' is not one of"),
        ({"gpu_driver_version": "550"}, "gpu_driver_version: '550' is not one of default, latest"),
        ({"plan_only": "yes"}, "plan_only: expected true or false"),
        ({"cluster": "Serving_1"}, "cluster: 'Serving_1' does not have the shape"),
        ({"cluster": "a" * 41}, "cluster: "),
        ({"location": "us-central"}, "location: 'us-central' does not have the shape"),
        ({"name": "vllm;rm -rf"}, "name: 'vllm;rm -rf' does not have the shape"),
        ({"namespace": "Prod"}, "namespace: 'Prod' does not have the shape"),
        ({"tpu_nodepools": ["ok", "Bad Pool"]}, "tpu_nodepools: 'Bad Pool' is not a node pool name"),
        ({"gpu_nodepools": "l4"}, "gpu_nodepools: expected a list of strings"),
        ({"tpu_image": "docker.io/vllm/vllm-tpu"}, "tpu_image: 'docker.io/vllm/vllm-tpu' is not pinned"),
        ({"tpu_image": "vllm/vllm-tpu:latest"}, "tpu_image: 'vllm/vllm-tpu:latest': 'latest' moves"),
        ({"gpu_image": "vllm/vllm-openai:v0.11.0 --privileged"}, "gpu_image: "),
        ({"gpu_image": "vllm/vllm-openai:v0.11\n"}, "gpu_image: control characters are not allowed"),
        ({"gpu_image": "VLLM/Openai:v1"}, "gpu_image: 'VLLM/Openai:v1' is not an image reference"),
        ({"hpa_metric": "a b"}, "hpa_metric: 'a b' is not a metric name"),
        ({"fallback_after_seconds": -1}, "fallback_after_seconds: must be at least 0"),
        ({"tpu_retry_seconds": 10}, "tpu_retry_seconds: must be at least 60"),
        ({"surprise": 1}, "unknown param 'surprise'"),
        ({"tpu_spot": True, "tpu_nodepools": ["v6e"]}, "tpu_spot: has no effect with tpu_nodepools"),
    ],
)
def test_bad_input_is_refused_naming_the_param(params: dict[str, object], expected: str) -> None:
    assert expected in _refused(checkpoint_uri=CKPT, **params)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("gs://interlude-local/a/b/", None),
        ("gs://interlude-local/model", None),
        ("s3://bucket/x", "is not gs://BUCKET/PATH"),
        ("gs://bucket", "is not gs://BUCKET/PATH"),
        ("gs://bucket/", "is not gs://BUCKET/PATH"),
        ("gs://Bucket/x", "is not a valid bucket name"),
        ("gs://googlebucket/x", "reserved by GCS"),
        ("gs://192.168.0.1/x", "is not a valid bucket name"),
        ("gs://bucket/a b", "is not gs://BUCKET/PATH"),
        ("gs://bucket/a/../b", "'..' path segment"),
        ("gs://bucket/a//b", "empty"),
        ("gs://bucket/" + "a" * 1025, "over 1024 bytes"),
    ],
)
def test_checkpoint_uri_shapes(uri: str, expected: str | None) -> None:
    problem = checkpoint_problem(uri)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith("checkpoint_uri: ") and expected in problem


def test_every_problem_is_reported_at_once() -> None:
    text = _refused(checkpoint_uri="s3://x", replicas_min=9, replicas_max=2, gpu_type="x", tpu_image="a b")
    for param in ("checkpoint_uri", "replicas_min", "gpu_type", "tpu_image"):
        assert f"- {param}:" in text


@pytest.mark.parametrize(
    ("ref", "name", "tag", "digest"),
    [
        ("vllm/vllm-tpu:v0.11.1", "docker.io/vllm/vllm-tpu", "v0.11.1", None),
        ("docker.io/vllm/vllm-openai:v0.11.0", "docker.io/vllm/vllm-openai", "v0.11.0", None),
        ("us-central1-docker.pkg.dev/p/repo/vllm:TPU", "us-central1-docker.pkg.dev/p/repo/vllm", "TPU", None),
        ("localhost:5000/x/y:1", "localhost:5000/x/y", "1", None),
        ("vllm/vllm-tpu@sha256:" + "a" * 64, "docker.io/vllm/vllm-tpu", None, "sha256:" + "a" * 64),
    ],
)
def test_image_references(ref: str, name: str, tag: str | None, digest: str | None) -> None:
    image = parse_image("tpu_image", ref)
    assert (image.name, image.tag, image.digest) == (name, tag, digest)


def test_every_tpu_shape_cites_a_public_page_and_is_single_host() -> None:
    for shape in load_table().tpu_shapes.values():
        assert shape.source.startswith("https://cloud.google.com/"), shape
        assert shape.chips <= 8, shape


def test_every_form_default_validates_against_its_own_schema() -> None:
    """Airflow's Param validates a value with jsonschema against the param's schema (as the DAG form will)."""
    for default, schema in ServeSpec.form_schema().values():
        jsonschema.validate(default, schema, format_checker=jsonschema.FormatChecker())
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"not": "a param value"}, schema)
