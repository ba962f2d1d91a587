"""CommittedCheckpointSensor: succeed once a stage has a committed, verified checkpoint at min_step.

Deferrable by default (the wait costs a worker slot nothing); the synchronous poke runs the very same
check (:func:`interlude.triggers.checkpoint.check_checkpoint`) so both modes succeed and fail alike.
Returns ``{"step", "uri"}`` (an XCom) on success. Fails on a corrupt checkpoint at the target (no retry
can repair it: AirflowFailException) and on a stall (AirflowException, so retries apply).
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.bases.sensor import PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from interlude.operators.conventions import default_deferrable
from interlude.triggers.checkpoint import CheckpointTrigger, check_checkpoint


def raise_for_event(event: dict[str, Any] | None) -> dict[str, Any]:
    """The sensor's result for a success event; the matching exception for anything else."""
    if not event or event.get("status") != "success":
        reason = (event or {}).get("reason", "unknown")
        message = (event or {}).get("message", f"checkpoint wait ended without success: {event!r}")
        if reason == "corrupt":
            raise AirflowFailException(message)
        raise AirflowException(f"{reason}: {message}")
    return {"step": int(event["step"]), "uri": event["uri"]}


class CommittedCheckpointSensor(BaseSensorOperator):
    """Wait until ``stage`` of run ``run_key`` has a committed, verified checkpoint at ``min_step`` or later.

    :param bucket: the GCS bucket holding the run's checkpoints (templated).
    :param run_key: the run's key (``interlude.naming.run_key``), which names its checkpoint prefix (templated).
    :param stage: the stage whose checkpoints to watch, e.g. ``train`` (templated).
    :param min_step: the lowest step that satisfies the wait (templated; rendered strings are converted).
    :param stall_timeout: fail (retryably) when no new checkpoint was committed for this many seconds.
    :param poll_interval: seconds between two looks, in both modes.
    :param deferrable: wait in the triggerer; defaults to ``[operators] default_deferrable`` (True if unset).
    :param fail_on_corrupt: a corrupt checkpoint at the target fails the task without retry.
    :param gcp_conn_id: the Google connection for GCS (None: the environment's credentials or emulator).
    :param project: the Google Cloud project of the storage client, used only when ``gcp_conn_id`` is None.
    """

    template_fields = ("bucket", "run_key", "stage", "min_step")

    def __init__(
        self,
        *,
        bucket: str,
        run_key: str,
        stage: str,
        min_step: int | str,
        stall_timeout: float = 1800.0,
        poll_interval: float = 30.0,
        deferrable: bool | None = None,
        fail_on_corrupt: bool = True,
        gcp_conn_id: str | None = None,
        project: str | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(**kwargs)
        self.bucket = bucket
        self.run_key = run_key
        self.stage = stage
        self.min_step = min_step
        self.stall_timeout = float(stall_timeout)
        self.poll_interval = float(poll_interval)
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.fail_on_corrupt = fail_on_corrupt
        self.gcp_conn_id = gcp_conn_id
        self.project = project
        self._since: float | None = None

    def _waiting_since(self, context: Any) -> float:
        """When this wait began: the first reschedule in reschedule mode, else the first execute."""
        if self._since is None:
            self._since = time.time()
            if self.reschedule and context and "ti" in context:
                first = context["ti"].get_first_reschedule_date(context)
                if first is not None:
                    self._since = first.timestamp()
        return self._since

    def _check(self, context: Any) -> dict[str, Any]:
        return check_checkpoint(
            bucket=self.bucket, run_key=self.run_key, stage=self.stage, min_step=int(self.min_step),
            stall_timeout=self.stall_timeout, since=self._waiting_since(context),
            fail_on_corrupt=self.fail_on_corrupt, gcp_conn_id=self.gcp_conn_id, project=self.project,
        )  # fmt: skip

    def poke(self, context: Any) -> bool | PokeReturnValue:
        outcome = self._check(context)
        for rejection in outcome.get("rejected", []):
            self.log.warning("rejected %s step %s: %s", self.stage, rejection["step"], rejection["reason"])
        if outcome["status"] == "waiting":
            self.log.info("%s: latest committed step %s, waiting for %s", self.stage,
                          outcome.get("latest_step"), self.min_step)  # fmt: skip
            return False
        return PokeReturnValue(is_done=True, xcom_value=raise_for_event(outcome))

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        outcome = self._check(context)
        if outcome["status"] != "waiting":
            return raise_for_event(outcome)
        self.defer(
            trigger=CheckpointTrigger(
                bucket=self.bucket,
                run_key=self.run_key,
                stage=self.stage,
                min_step=int(self.min_step),
                stall_timeout=self.stall_timeout,
                since=self._waiting_since(context),
                poll_interval=self.poll_interval,
                fail_on_corrupt=self.fail_on_corrupt,
                gcp_conn_id=self.gcp_conn_id,
                project=self.project,
            ),  # fmt: skip
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        result = raise_for_event(event)
        self.log.info("%s checkpoint step %s committed: %s", self.stage, result["step"], result["uri"])
        return result
