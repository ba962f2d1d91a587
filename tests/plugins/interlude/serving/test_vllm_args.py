"""The rendered `vllm serve` args against vLLM's own parser (when vLLM is installed) or its flag table
(vllm_serve_flags.yaml, from vLLM's CLI reference): every flag the renderer emits is vLLM's, an unknown one is
refused, and the stand-in the local cloud runs accepts exactly the table's flags."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from interlude.serving import render, vllm_args
from interlude.serving.plan import plan
from interlude.serving.spec import ServeSpec

EXPORT = "gs://interlude-local/interlude/run-1/finetune/export-00000030"
STANDIN = Path(__file__).resolve().parents[4] / "include" / "serving" / "vllm_standin.py"
SPECS = [
    ServeSpec(checkpoint_uri=EXPORT),
    ServeSpec(checkpoint_uri=EXPORT, model_loader="gcsfuse", max_model_len=256, tpu_type="v6e-8"),
    ServeSpec(checkpoint_uri=EXPORT, gpu_image="docker.io/vllm/vllm-openai:v0.11.1", gpu_type="nvidia-h100-80gb"),
]


def _serve_args(spec: ServeSpec) -> list[list[str]]:
    deployment = next(o for o in render.render_all(spec) if o["kind"] == "Deployment")
    found = [vllm_args.serve_args_of(c) for c in deployment["spec"]["template"]["spec"]["containers"]]
    return [a for a in found if a is not None]


@pytest.mark.parametrize("spec", SPECS)
def test_every_flag_the_renderer_emits_is_in_vllms_table_and_parses(spec: ServeSpec) -> None:
    table = vllm_args.load_flags()["flags"]
    for args in _serve_args(spec):
        names = {a.split("=", 1)[0] for a in args if a.startswith("-")}
        assert names <= set(table), names - set(table)
        assert vllm_args.check_serve_args(args, use_vllm=False) == []
    assert len(_serve_args(spec)) == 2  # both containers were checked


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ([EXPORT, "--bogus=1"], "unrecognized arguments: --bogus=1"),
        ([EXPORT, "--port=eighty"], "argument --port: invalid int value: 'eighty'"),
        ([EXPORT, "--load-forma=runai_streamer"], "unrecognized arguments: --load-forma=runai_streamer"),
        ([EXPORT, "--load-format=runai"], "Load format `runai` is not supported"),
        ([EXPORT, "--model-loader-extra-config={bad"], "argument --model-loader-extra-config: invalid loads value"),
        (["--port=8000"], "no model given"),
    ],
)
def test_what_vllm_refuses_is_refused(args: list[str], problem: str) -> None:
    problems = vllm_args.check_serve_args(args, use_vllm=False)
    assert len(problems) == 1 and problem in problems[0], problems
    assert "docs.vllm.ai" in problems[0] or "no model" in problem or "Load format" in problem


def test_the_plan_carries_the_args_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vLLM whose parser lacks a flag the renderer emits (here: a table without --load-format) refuses the plan."""
    table = vllm_args.load_flags()
    narrowed = {**table, "flags": {k: v for k, v in table["flags"].items() if k != "--load-format"}}
    monkeypatch.setattr(vllm_args, "load_flags", lambda: narrowed)
    result = plan(SPECS[0])
    assert not result.ok
    assert [p for p in result.problems if "--load-format" in p] == [
        "Deployment/interlude-vllm container vllm-tpu: vllm serve: unrecognized arguments: "
        f"--load-format=runai_streamer (source: {table['source']})"
    ]


def test_the_plan_refuses_a_deployment_vllm_would_not_start() -> None:
    result = plan(SPECS[0])
    assert result.ok, result.problems
    deployment = next(o for o in result.objects if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][1]["args"].append("--max-modle-len=64")
    problems = vllm_args.deployment_problems(deployment)
    assert problems == [
        f"Deployment/interlude-vllm container vllm-gpu: vllm serve: unrecognized arguments: --max-modle-len=64 "
        f"(source: {vllm_args.load_flags()['source']})"
    ]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here")
@pytest.mark.parametrize("spec", SPECS)
def test_vllms_own_parser_accepts_the_rendered_args(spec: ServeSpec) -> None:
    for args in _serve_args(spec):
        assert vllm_args.check_serve_args(args, use_vllm=True) == []


def test_the_stand_in_accepts_every_flag_of_the_table_and_refuses_others() -> None:
    """The local cloud's vLLM must not accept more than vLLM: each table flag parses in the stand-in, an unknown
    one exits 2 with argparse's words (parse only: --help after the flags stops before anything loads)."""
    samples = {"str": "x", "int": "1", "float": "0.5", "json": "{}"}
    flags: list[str] = []
    for name, row in vllm_args.load_flags()["flags"].items():
        kind = str(row["type"])
        flags += [name] if kind in ("bool", "flag") else [name, samples[kind]]
    ok = subprocess.run(
        [sys.executable, str(STANDIN), "serve", EXPORT, *flags, "--help"], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        [sys.executable, str(STANDIN), "serve", EXPORT, "--not-a-vllm-flag"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unrecognized arguments: --not-a-vllm-flag" in bad.stderr
