"""CheckpointTrigger: wait, in the triggerer, for a committed and verified checkpoint of a stage.

The question "is there a checkpoint at or beyond step N?" is answered by the workload's own contract
(:mod:`interlude_workload.orbax_layout`), never re-implemented here: the highest Orbax step directory with
Orbax's own ``commit_success.txt`` whose ``_CHECKPOINT_METADATA`` carries the commit time and whose items each
have their marker (one list call plus one small metadata read per poll).

The same :func:`check_checkpoint` serves the sensor's poke, so the deferred and the synchronous sensor
succeed and fail in exactly the same cases:

* success: a verified checkpoint with step >= ``min_step``;
* error "corrupt": a committed checkpoint at or beyond ``min_step`` fails verification and none
  verifies there (corrupt ones are never counted; with ``fail_on_corrupt=False`` they are only logged);
* error "stalled": no committed checkpoint newer than ``stall_timeout`` seconds (GCS's creation time
  of the step's ``commit_success.txt``, so the answer is the same after a triggerer restart or in a duplicate copy).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


def _client(gcp_conn_id: str | None, project: str | None) -> Any:
    """The blocking storage client: an Airflow connection when named, else environment/emulator."""
    if gcp_conn_id:
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        return GCSHook(gcp_conn_id=gcp_conn_id).get_conn()
    from interlude_workload.gcs import storage_client  # not at import: DAG files import this module

    return storage_client(project)


def check_checkpoint(
    *,
    bucket: str,
    run_key: str,
    stage: str,
    min_step: int,
    stall_timeout: float,
    since: float,
    fail_on_corrupt: bool = True,
    gcp_conn_id: str | None = None,
    project: str | None = None,
    client: Any = None,
    now: float | None = None,
) -> dict[str, Any]:
    """One blocking look at GCS. Returns an event payload: status success | waiting | error."""
    from interlude_workload.checkpoints import CheckpointStore

    store = CheckpointStore(bucket, run_key, stage, client=client or _client(gcp_conn_id, project))
    result = store.latest(verify="metadata")
    rejected = [r.as_dict() for r in result.rejected if r.corrupt]
    checkpoint = result.checkpoint
    base: dict[str, Any] = {"bucket": bucket, "run_key": run_key, "stage": stage, "min_step": min_step}
    if checkpoint is not None and checkpoint.step >= min_step:
        return {**base, "status": "success", "step": checkpoint.step, "uri": checkpoint.uri,
                "metrics": checkpoint.metrics, "rejected": rejected}  # fmt: skip
    corrupt = [r for r in rejected if r["step"] >= min_step]
    if corrupt and fail_on_corrupt:
        worst = corrupt[0]
        return {**base, "status": "error", "reason": "corrupt", "rejected": rejected,
                "message": f"{stage} checkpoint at step {worst['step']} is committed but corrupt: "
                           f"{worst['reason']} ({store.uri(worst['step'])})"}  # fmt: skip
    now = time.time() if now is None else now
    last_commit = checkpoint.committed_at.timestamp() if checkpoint and checkpoint.committed_at else None
    quiet_since = max(since, last_commit or since)
    if now - quiet_since > stall_timeout:
        latest = f"latest committed step {checkpoint.step}" if checkpoint else "no committed checkpoint"
        return {**base, "status": "error", "reason": "stalled", "rejected": rejected,
                "latest_step": checkpoint.step if checkpoint else None,
                "message": f"{stage} stalled: {latest}, nothing new for {now - quiet_since:.0f}s "
                           f"(stall_timeout {stall_timeout:.0f}s, waiting for step {min_step})"}  # fmt: skip
    return {**base, "status": "waiting", "latest_step": checkpoint.step if checkpoint else None,
            "rejected": rejected}  # fmt: skip


class CheckpointTrigger(BaseTrigger):
    """Poll the stage's checkpoints until :func:`check_checkpoint` says success or error; yield once.

    A GCS call that fails is retried at the next poll; failing for longer than ``stall_timeout`` ends the wait
    with reason ``unreachable``.

    :param bucket: the GCS bucket holding the run's checkpoints.
    :param run_key: the run's key (``interlude.naming.run_key``), which names its checkpoint prefix.
    :param stage: the stage whose checkpoints to watch, e.g. ``train``.
    :param min_step: the lowest step that satisfies the wait.
    :param stall_timeout: seconds without a newer committed checkpoint (counted from ``since`` or the last
        step's ``commit_success.txt`` GCS creation time, whichever is later) before the wait ends as ``stalled``.
    :param since: when the wait began, in epoch seconds; None: now. Serialized, so a restarted copy keeps it.
    :param poll_interval: seconds between two looks.
    :param fail_on_corrupt: a corrupt committed checkpoint at or beyond ``min_step`` ends the wait as
        ``corrupt``; False only logs it and keeps waiting.
    :param gcp_conn_id: the Airflow connection for GCS; None: the environment's credentials or the emulator.
    :param project: the Google Cloud project of the storage client, used only when ``gcp_conn_id`` is None.
    """

    def __init__(
        self,
        *,
        bucket: str,
        run_key: str,
        stage: str,
        min_step: int,
        stall_timeout: float,
        since: float | None = None,
        poll_interval: float = 30.0,
        fail_on_corrupt: bool = True,
        gcp_conn_id: str | None = None,
        project: str | None = None,
    ) -> None:
        super().__init__()
        self.bucket = bucket
        self.run_key = run_key
        self.stage = stage
        self.min_step = int(min_step)
        self.stall_timeout = float(stall_timeout)
        # When the wait began; fixed at construction and serialized, so a restarted copy keeps it.
        self.since = float(since) if since is not None else time.time()
        self.poll_interval = float(poll_interval)
        self.fail_on_corrupt = bool(fail_on_corrupt)
        self.gcp_conn_id = gcp_conn_id
        self.project = project

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "bucket": self.bucket,
                "run_key": self.run_key,
                "stage": self.stage,
                "min_step": self.min_step,
                "stall_timeout": self.stall_timeout,
                "since": self.since,
                "poll_interval": self.poll_interval,
                "fail_on_corrupt": self.fail_on_corrupt,
                "gcp_conn_id": self.gcp_conn_id,
                "project": self.project,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        client = await asyncio.to_thread(_client, self.gcp_conn_id, self.project)
        reported: set[int] = set()
        last_ok = time.time()
        while True:
            try:
                outcome = await asyncio.to_thread(
                    check_checkpoint, bucket=self.bucket, run_key=self.run_key, stage=self.stage,
                    min_step=self.min_step, stall_timeout=self.stall_timeout, since=self.since,
                    fail_on_corrupt=self.fail_on_corrupt, client=client,
                )  # fmt: skip
                last_ok = time.time()
            except Exception as exc:  # noqa: BLE001 - GCS hiccups are retried until they look like a stall
                self.log.warning("checkpoint poll of %s/%s failed: %s", self.run_key, self.stage, exc)
                if time.time() - last_ok > self.stall_timeout:
                    yield TriggerEvent(
                        {
                            "status": "error",
                            "reason": "unreachable",
                            "stage": self.stage,
                            "message": f"GCS unreachable for {self.stall_timeout:.0f}s: {exc}",
                        }
                    )
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            for rejection in outcome.get("rejected", []):
                if rejection["step"] not in reported:
                    reported.add(rejection["step"])
                    self.log.warning("rejected %s step %s: %s", self.stage, rejection["step"], rejection["reason"])
            if outcome["status"] != "waiting":
                yield TriggerEvent(outcome)
                return
            self.log.info("%s/%s: latest committed step %s, waiting for %s", self.run_key, self.stage,
                          outcome.get("latest_step"), self.min_step)  # fmt: skip
            await asyncio.sleep(self.poll_interval)
