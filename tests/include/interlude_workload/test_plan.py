"""Stage plans: what the agent on the machine runs, as an argv list (never a shell string)."""

from __future__ import annotations

import pytest

from interlude_workload.plan import StagePlan


def test_trainer_args_carry_every_setting() -> None:
    plan = StagePlan(
        order=2,
        stage="finetune",
        steps=30,
        checkpoint_every=10,
        seed=3,
        step_seconds=0.1,
        init_from_stage="train",
        data_date="2024-01-15",
        fresh_token="t1",
        model_size="tiny",
    )
    args = plan.trainer_args("bucket", "key; rm -rf /")
    assert args[args.index("--model-size") + 1] == "tiny"
    assert args[args.index("--run-key") + 1] == "key; rm -rf /"
    assert args[args.index("--fresh") + 1] == "t1"
    assert args[args.index("--init-from-stage") + 1] == "train"
    plain = StagePlan(order=1, stage="train", steps=1, checkpoint_every=1, seed=0)
    assert "--fresh" not in plain.trainer_args("b", "k") and "--model-size" not in plain.trainer_args("b", "k")


def test_the_dag_param_offers_exactly_the_trainers_model_sizes() -> None:
    """The plugin does not import JAX: its list of sizes is a copy, kept equal here."""
    from interlude.training.spec import MODEL_SIZES, RunSpec
    from interlude_workload.llm.train_step import DEFAULT_SIZE, SIZES
    from interlude_workload.train import parse_args

    assert set(MODEL_SIZES) == set(SIZES) and RunSpec().model_size == DEFAULT_SIZE == MODEL_SIZES[0]
    base = ["--bucket", "b", "--run-key", "k", "--stage", "train", "--steps", "1", "--checkpoint-every", "1"]
    assert {parse_args([*base, "--model-size", name]).model_size for name in MODEL_SIZES} == set(SIZES)
    with pytest.raises(SystemExit):
        parse_args([*base, "--model-size", "huge"])


@pytest.mark.parametrize("bad", [{"stage": "Train!"}, {"steps": 0}, {"checkpoint_every": 0}])
def test_bad_plans_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        StagePlan(**{"order": 1, "stage": "train", "steps": 5, "checkpoint_every": 1, "seed": 0, **bad})
