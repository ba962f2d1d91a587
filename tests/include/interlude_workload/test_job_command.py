"""workload_command: the placeholders a user's job may name, rendered inside one argv item each (no shell)."""

from __future__ import annotations

import pytest

from interlude_workload import job_command
from interlude_workload.plan import StagePlan

VALUES = {
    "checkpoint_dir": "gs://b/interlude/k/finetune/checkpoints",
    "init_from_dir": "gs://b/interlude/k/train/checkpoints",
    "steps": "30",
    "checkpoint_every": "10",
    "seed": "7",
    "stage": "finetune",
    "run_key": "k",
    "bucket": "b",
    "data_date": "2024-01-15",
}


def test_every_placeholder_renders_inside_its_own_argument() -> None:
    command = ["python", "-m", "maxtext.train", *(f"--{name}={{{name}}}" for name in job_command.PLACEHOLDERS)]
    assert job_command.problems(command) == []
    argv = job_command.render(command, VALUES)
    assert argv[:3] == ["python", "-m", "maxtext.train"]
    assert argv[3:] == [f"--{name}={VALUES[name]}" for name in job_command.PLACEHOLDERS]


def test_a_value_with_shell_syntax_stays_one_argument() -> None:
    argv = job_command.render(["job", "{data_date}"], {**VALUES, "data_date": "x; rm -rf / $(id)"})
    assert argv == ["job", "x; rm -rf / $(id)"]


def test_literal_braces_are_written_doubled() -> None:
    assert job_command.problems(["job", '{{"a": 1}}']) == []
    assert job_command.render(["job", '{{"a": 1}}'], VALUES) == ["job", '{"a": 1}']


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["job", "{nope}"], "workload_command[1]: unknown placeholder {nope}"),
        (["job", "{steps!r}"], "workload_command[1]: {steps} carries a format spec or conversion"),
        (["job", "{steps:5}"], "workload_command[1]: {steps} carries a format spec or conversion"),
        (["job", "{steps.real}"], "workload_command[1]: unknown placeholder {steps.real}"),
        (["job", "}"], "workload_command[1]:"),
        (["  ", "x"], "workload_command: the first argument (the program) is empty"),
        (["job", "x" * 1025], "workload_command[1]: longer than 1024 characters"),
    ],
)
def test_problems_name_the_param_and_the_argument(command: list[str], said: str) -> None:
    assert any(said in p for p in job_command.problems(command)), job_command.problems(command)


def test_the_environment_carries_the_same_values() -> None:
    env = job_command.environment(VALUES)
    assert env["INTERLUDE_JOB_CHECKPOINT_DIR"] == VALUES["checkpoint_dir"] and len(env) == len(VALUES)


def test_a_plan_names_its_stage_directories_as_the_store_does() -> None:
    from interlude_workload.checkpoints import CheckpointStore
    from interlude_workload.job import job_values

    plan = StagePlan(order=2, stage="finetune", steps=30, checkpoint_every=10, seed=7, init_from_stage="train")
    values = job_values(plan, "b", "k")
    assert set(values) == set(job_command.PLACEHOLDERS)

    class _Client:
        def bucket(self, name: str) -> object:
            return object()

    assert values["checkpoint_dir"] == CheckpointStore("b", "k", "finetune", client=_Client()).checkpoints_uri  # type: ignore[arg-type]
    assert values["init_from_dir"] == CheckpointStore("b", "k", "train", client=_Client()).checkpoints_uri  # type: ignore[arg-type]
    assert values["data_date"] == "" and values["steps"] == "30"
