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
    )
    args = plan.trainer_args("bucket", "key; rm -rf /")
    assert args[args.index("--run-key") + 1] == "key; rm -rf /"
    assert args[args.index("--fresh") + 1] == "t1"
    assert args[args.index("--init-from-stage") + 1] == "train"
    plain = StagePlan(order=1, stage="train", steps=1, checkpoint_every=1, seed=0)
    assert "--fresh" not in plain.trainer_args("b", "k")


@pytest.mark.parametrize("bad", [{"stage": "Train!"}, {"steps": 0}, {"checkpoint_every": 0}])
def test_bad_plans_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        StagePlan(**{"order": 1, "stage": "train", "steps": 5, "checkpoint_every": 1, "seed": 0, **bad})
