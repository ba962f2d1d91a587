"""How each container reads the export: the Run:ai streamer where Google documents it for the image, else a Cloud
Storage FUSE CSI volume; Workload Identity on the pods' ServiceAccount; refusals naming the param.

Facts from the pages: GKE's Run:ai page ("built-in authentication support for Cloud Storage requires vLLM version
0.11.1 or later"), Google's TPU announcement ("natively supports TPUs with Google Cloud Storage starting in TPU
vLLM 0.18.0"), GKE's Cloud Storage FUSE CSI ephemeral volume page (annotation gke-gcsfuse/volumes: "true", driver
gcsfuse.csi.storage.gke.io, volumeAttributes bucketName/mountOptions), GKE's Workload Identity page
(iam.gke.io/gcp-service-account on the KSA).
"""

from __future__ import annotations

from typing import Any

import pytest

from interlude.serving import loading, render
from interlude.serving.plan import plan
from interlude.serving.runtime_check import check_runtimes
from interlude.serving.spec import ServeSpec, ServeSpecError
from interlude.serving.tables import load_table

EXPORT = "gs://interlude-local/interlude/run-1/finetune/export-00000030/"
BASE = ServeSpec(checkpoint_uri=EXPORT)


def _pod(spec: ServeSpec) -> dict[str, Any]:
    deployment = next(o for o in render.render_all(spec) if o["kind"] == "Deployment")
    return dict(deployment["spec"]["template"])


def _container(spec: ServeSpec, name: str) -> dict[str, Any]:
    return next(c for c in _pod(spec)["spec"]["containers"] if c["name"] == name)


@pytest.mark.parametrize(
    ("kind", "image", "loader"),
    [
        ("tpu", "docker.io/vllm/vllm-tpu:v0.18.0", "runai_streamer"),  # the first TPU release with the streamer
        ("tpu", "docker.io/vllm/vllm-tpu:v0.27.0", "runai_streamer"),
        ("tpu", "docker.io/vllm/vllm-tpu:v0.13.2", "gcsfuse"),
        ("tpu", "docker.io/vllm/vllm-tpu:2e33fe419186c65a18da6668972d61d7bbc31564", "gcsfuse"),  # a nightly
        ("gpu", "docker.io/vllm/vllm-openai:v0.11.0", "gcsfuse"),
        ("gpu", "docker.io/vllm/vllm-openai:v0.11.1", "runai_streamer"),  # the first GPU release with GCS auth
        ("gpu", "docker.io/vllm/vllm-openai:v0.28.0-cu129", "runai_streamer"),
        ("gpu", "docker.io/vllm/vllm-openai@sha256:" + "a" * 64, "gcsfuse"),  # a digest names no release
    ],
)
def test_auto_takes_the_streamer_where_the_image_has_it(kind: str, image: str, loader: str) -> None:
    spec = BASE.replace(**{f"{kind}_image": image})
    assert loading.loader_for(spec, kind, load_table()) == loader


def test_the_default_pod_streams_on_tpu_and_mounts_on_gpu() -> None:
    tpu, gpu = _container(BASE, "vllm-tpu"), _container(BASE, "vllm-gpu")
    serve = tpu["args"][tpu["args"].index("serve") :]
    assert serve[1] == EXPORT.rstrip("/") and "--load-format=runai_streamer" in serve
    assert gpu["args"][:3] == ["vllm", "serve", "/models/export"] and not any("load-format" in a for a in gpu["args"])
    assert {"name": "model-export", "mountPath": "/models/export", "readOnly": True} in gpu["volumeMounts"]
    assert all(m["name"] != "model-export" for m in tpu["volumeMounts"])
    pod = _pod(BASE)
    assert pod["metadata"]["annotations"]["gke-gcsfuse/volumes"] == "true"
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "model-export"]
    assert volume["csi"] == {
        "driver": "gcsfuse.csi.storage.gke.io",
        "readOnly": True,
        "volumeAttributes": {
            "bucketName": "interlude-local",
            "mountOptions": "implicit-dirs,only-dir=interlude/run-1/finetune/export-00000030",
        },
    }


def test_streaming_on_both_needs_no_fuse_volume_nor_its_annotation() -> None:
    spec = BASE.replace(gpu_image="docker.io/vllm/vllm-openai:v0.11.1")
    pod = _pod(spec)
    assert "gke-gcsfuse/volumes" not in pod["metadata"]["annotations"]
    assert all(v["name"] != "model-export" for v in pod["spec"]["volumes"])
    assert "--load-format=runai_streamer" in _container(spec, "vllm-gpu")["args"]


def test_gcsfuse_can_be_chosen_for_both() -> None:
    spec = BASE.replace(model_loader="gcsfuse")
    for name in ("vllm-tpu", "vllm-gpu"):
        args = _container(spec, name)["args"]
        assert args[args.index("serve") + 1] == "/models/export" and not any("load-format" in a for a in args)
    assert check_runtimes(spec).ok


def test_runai_streamer_on_an_image_without_it_is_refused_naming_the_param() -> None:
    report = check_runtimes(BASE.replace(model_loader="runai_streamer"))
    errors = report.errors()
    assert len(errors) == 1 and errors[0].startswith("error: model_loader: runai_streamer cannot load gs:// in ")
    assert "docker.io/vllm/vllm-openai:v0.11.0" in errors[0] and "from 0.11.1" in errors[0]
    assert "run-ai-model-streamer" in errors[0]  # the source: GKE's Run:ai page
    old_tpu = check_runtimes(BASE.replace(model_loader="runai_streamer", tpu_image="docker.io/vllm/vllm-tpu:v0.13.2"))
    assert any("vllm-tpu:v0.13.2" in e and "from 0.18.0" in e for e in old_tpu.errors())
    fine = check_runtimes(
        BASE.replace(model_loader="runai_streamer", gpu_image="docker.io/vllm/vllm-openai:v0.11.1"),
        gpu_driver="575.51.03",
    )
    assert fine.ok, fine.errors()
    assert dict(fine.loaders) == {"tpu": "runai_streamer", "gpu": "runai_streamer"}
    assert not plan(BASE.replace(model_loader="runai_streamer")).ok  # the plan carries the refusal


def test_workload_identity_annotates_the_service_account() -> None:
    gsa = "vllm-reader@my-project.iam.gserviceaccount.com"
    objects = render.render_all(BASE.replace(gcp_service_account=gsa))
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    assert account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == gsa
    assert _pod(BASE)["spec"]["serviceAccountName"] == account["metadata"]["name"]
    plain = next(o for o in render.render_all(BASE) if o["kind"] == "ServiceAccount")
    assert "iam.gke.io/gcp-service-account" not in plain["metadata"]["annotations"]  # direct principal grant
    with pytest.raises(ServeSpecError, match="gcp_service_account: 'not-an-email' is not a service account"):
        ServeSpec.from_params({"checkpoint_uri": EXPORT, "gcp_service_account": "not-an-email"})


def test_max_model_len_is_left_to_the_model_unless_set() -> None:
    args = _container(BASE, "vllm-gpu")["args"]
    assert not any(a.startswith("--max-model-len") for a in args)  # vLLM derives it from config.json
    assert "--max-model-len=256" in _container(BASE.replace(max_model_len=256), "vllm-gpu")["args"]
    with pytest.raises(ServeSpecError, match="max_model_len: must be 0"):
        ServeSpec.from_params({"checkpoint_uri": EXPORT, "max_model_len": 8})
