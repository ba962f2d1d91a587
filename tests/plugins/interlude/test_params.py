"""The shared param coercion of RunSpec and ServeSpec (interlude.params): finite numbers only, short quotes.

Parametrized over each spec's own fields, so a number param added later is covered without touching this file.
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any

import pytest

from interlude.params import ParamsError
from interlude.serving.spec import ServeSpec
from interlude.training.spec import RunSpec

CKPT = "gs://interlude-local/interlude/run/finetune/step-00000030/"
SPECS: dict[type, dict[str, Any]] = {RunSpec: {}, ServeSpec: {"checkpoint_uri": CKPT}}


def _numbers(cls: type) -> list[tuple[type, str]]:
    fields = dataclasses.fields(cls)
    return [(cls, f.name) for f in fields if f.metadata.get("param", {}).get("type") in ("number", "integer")]


NUMBER_PARAMS = [pair for cls in SPECS for pair in _numbers(cls)]


def _refusal(cls: type, params: dict[str, Any]) -> str:
    with pytest.raises(ParamsError) as info:
        cls.from_params({**SPECS[cls], **params})  # type: ignore[attr-defined]
    return str(info.value)


def test_every_number_param_of_both_specs_is_covered() -> None:
    """RunSpec has 12 number params and 4 integer ones (issue 32.5 counted the 12)."""
    run = [name for cls, name in NUMBER_PARAMS if cls is RunSpec]
    assert len(run) == 16 and "stall_timeout_seconds" in run
    assert len([name for cls, name in NUMBER_PARAMS if cls is ServeSpec]) >= 14


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), "nan", "NaN", "inf", "-Infinity", "1e999"]
)
@pytest.mark.parametrize(("cls", "name"), NUMBER_PARAMS, ids=[f"{c.__name__}.{n}" for c, n in NUMBER_PARAMS])
def test_nan_and_infinities_are_refused_naming_the_param(cls: type, name: str, value: Any) -> None:
    """NaN passes every range check (each comparison with it is false): a NaN stall_timeout_seconds made the stage
    machine never act on a stall. Refused in the shared coercion, whatever spec, as a number or as text."""
    message = _refusal(cls, {name: value})
    assert f"{name}: expected a " in message, message


def test_a_finite_number_still_passes() -> None:
    assert RunSpec.from_params({"stall_timeout_seconds": "30.5"}).stall_timeout_seconds == 30.5
    assert ServeSpec.from_params({**SPECS[ServeSpec], "poll_seconds": 2}).poll_seconds == 2.0


BIG = "x" * 10_000
STRING_PARAMS = [
    (cls, f.name)
    for cls in SPECS
    for f in dataclasses.fields(cls)
    if "param" in f.metadata and "string" in str(f.metadata["param"].get("type")) and f.name != "checkpoint_uri"
]


def _short(message: str) -> None:
    """No refusal echoes a 10 kB value: each problem quotes at most a short prefix and says how long it was."""
    assert BIG[:200] not in message, message[:300]
    assert all(len(line) < 1_000 for line in message.splitlines()), max(message.splitlines(), key=len)[:300]


@pytest.mark.parametrize(("cls", "name"), STRING_PARAMS, ids=[f"{c.__name__}.{n}" for c, n in STRING_PARAMS])
def test_a_10_kb_string_param_is_quoted_by_a_short_prefix(cls: type, name: str) -> None:
    message = _refusal(cls, {name: BIG + "!"})
    assert f"{name}: " in message and "…(10003 chars)" in message, message[:500]
    _short(message)


@pytest.mark.parametrize(
    "params",
    [
        {"zones": [BIG]},
        {"zones": BIG},
        {"train_steps": BIG},
        {"train_steps": "9" * 10_000},  # more digits than Python's int() takes: still refused naming the param
        {"poll_seconds": BIG},
        {"spot": BIG},
        {"bucket": "ab\n" + BIG},
        {BIG: 1},
    ],
    ids=["zone", "zones-not-a-list", "int", "int-digits", "float", "bool", "control-chars", "unknown-key"],
)
def test_every_refusal_of_a_10_kb_run_input_is_short(params: dict[str, Any]) -> None:
    message = _refusal(RunSpec, params)
    assert "chars)" in message, message[:500]
    _short(message)


@pytest.mark.parametrize(
    "params",
    [
        {"checkpoint_uri": "gs://" + BIG},
        {"checkpoint_uri": "https://" + BIG},
        {"tpu_image": "docker.io/vllm/vllm-tpu " + BIG},
        {"tpu_nodepools": [BIG]},
        {"hpa_metric": BIG + " "},
    ],
    ids=["uri-bucket", "uri-scheme", "image", "nodepool", "metric"],
)
def test_every_refusal_of_a_10_kb_serving_input_is_short(params: dict[str, Any]) -> None:
    message = _refusal(ServeSpec, params)
    assert "chars)" in message, message[:500]
    _short(message)


def test_a_short_value_is_quoted_whole() -> None:
    assert "zones: 'nowhere' is not a zone name" in _refusal(RunSpec, {"zones": ["nowhere"]})
    assert string.ascii_lowercase in _refusal(RunSpec, {"zones": [string.ascii_lowercase]})
