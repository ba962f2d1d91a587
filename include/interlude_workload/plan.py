"""Stage plans: how the control plane hands a stage of work to a machine.

On Google Cloud the control plane has no way into a VM besides SSH, and a machine that reboots after
maintenance must know by itself what to run. So the operator writes one small JSON object per stage
under the run's prefix, and the machine's agent (started by the startup script on every boot) runs
the plans in order, each resuming from its latest committed checkpoint. Writing a plan twice is
harmless: the same stage gets the same object.

    gs://BUCKET/interlude/RUN_KEY/plan/01-train.json
    gs://BUCKET/interlude/RUN_KEY/plan/02-finetune.json
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from google.cloud import storage
from google.cloud.storage.retry import DEFAULT_RETRY

from interlude_workload import layout
from interlude_workload.gcs import storage_client

_STAGE = re.compile(r"^[a-z][a-z0-9_-]{0,30}$")


@dataclass(frozen=True)
class StagePlan:
    order: int
    stage: str
    steps: int
    checkpoint_every: int
    seed: int
    step_seconds: float = 0.0
    init_from_stage: str | None = None
    data_date: str | None = None
    keep_checkpoints: int = 3
    fresh_token: str | None = None  # start over once per token (a reprocessing backfill reuses run ids)
    hold_at_step: int | None = None  # a drill: commit this step and hold there until the maintenance came
    hold_margin_seconds: float | None = None  # checkpoint and hold this long before a maintenance window
    hold_margin_commits: float | None = None  # ... or this many measured checkpoint costs, if longer
    model_size: str | None = None  # the reference model's size (llm.train_step.SIZES); None: the trainer's default
    command: list[str] | None = None  # the user's own job (job_command placeholders); None: the reference trainer

    def __post_init__(self) -> None:
        if not _STAGE.match(self.stage):
            raise ValueError(f"stage {self.stage!r} must match {_STAGE.pattern}")
        if self.steps < 1 or self.checkpoint_every < 1:
            raise ValueError("steps and checkpoint_every must be positive")

    def trainer_args(self, bucket: str, run_key: str) -> list[str]:
        """Arguments for `python -m interlude_workload.train` (an argv list: never a shell string)."""
        from interlude_workload.startup import trainer_args

        return trainer_args(
            bucket=bucket,
            run_key=run_key,
            stage=self.stage,
            steps=self.steps,
            checkpoint_every=self.checkpoint_every,
            seed=self.seed,
            init_from_stage=self.init_from_stage,
            data_date=self.data_date,
            step_seconds=self.step_seconds,
            keep=self.keep_checkpoints,
            fresh=self.fresh_token,
            hold_at_step=self.hold_at_step,
            hold_margin_seconds=self.hold_margin_seconds,
            hold_margin_commits=self.hold_margin_commits,
            model_size=self.model_size,
        )


def plan_prefix(run_key: str) -> str:
    return layout.plan_prefix(run_key)


def write_plan(bucket: str, run_key: str, plan: StagePlan, client: storage.Client | None = None) -> str:
    client = client or storage_client()
    name = layout.plan_object(run_key, plan.order, plan.stage)
    client.bucket(bucket).blob(name).upload_from_string(
        json.dumps(asdict(plan), sort_keys=True), content_type="application/json"
    )
    return f"gs://{bucket}/{name}"


def read_plans(
    bucket: str, run_key: str, client: storage.Client | None = None, retry: Any = DEFAULT_RETRY
) -> list[StagePlan]:
    """The run's stage plans in order. ``retry``: the storage library's retry (the agent bounds it, to say
    what fails on the serial console sooner than the library's two minutes)."""
    client = client or storage_client()
    plans: list[StagePlan] = []
    for blob in client.list_blobs(bucket, prefix=plan_prefix(run_key), retry=retry):
        if blob.name.endswith(".json"):
            data: dict[str, Any] = json.loads(blob.download_as_bytes(retry=retry))
            plans.append(StagePlan(**data))
    return sorted(plans, key=lambda p: p.order)
