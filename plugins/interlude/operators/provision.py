"""ProvisionOperator: the lifecycle DAG's setup task, with its long waits in the triggerer.

Two waits used to sleep on a worker while the task held its slot: a queued resource waiting for
capacity (up to an hour) and a quota error waiting for other runs to finish (up to ten minutes).
Both now defer (like the Google provider's deferrable create operators): the queued resource to
:class:`~interlude.triggers.provision.QueuedResourceTrigger`, the quota wait to a
:class:`~interlude.triggers.provision.QuotaWaitTrigger` after which the create is tried again.
The task runs in the default pool, which does not count deferred tasks, so a waiting provision
frees its slot; the accelerator pool is for the stage tasks that hold a machine.

Before every create call the intent record is written (interlude.machines.ledger), so a worker killed after
the call leaves nothing teardown cannot find.
"""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

GCP_CONN_ID = "google_cloud_default"


class ProvisionOperator(BaseOperator):
    """Create (or adopt) the run's machine from the validated decision; return the machine record.

    Reads the RunSpec (``resolve_run``), the validated decision (``validate_runtime``) and the capacity report
    (``choose.evaluate_capacity``) from XCom. A queued resource is waited for in the triggerer, and a failed
    one is deleted before the task fails; a quota error or a full machine-slot count is waited out there too.

    :param gcp_conn_id: the Google connection the queued-resource wait and its clean-up use. The create and
        queue calls themselves go through ``interlude.training.tasks.GCP_CONN_ID`` (``google_cloud_default``).
    :param poll_interval: seconds between two looks at a queued resource; at most 4 x the run's
        ``poll_seconds``, whichever is shorter.
    """

    ui_color = "#d7ecff"

    def __init__(self, *, gcp_conn_id: str = GCP_CONN_ID, poll_interval: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gcp_conn_id = gcp_conn_id
        self.poll_interval = poll_interval

    @staticmethod
    def _spec(context: Any) -> Any:
        from interlude.training.spec import RunSpec

        return RunSpec.from_dict(context["ti"].xcom_pull(task_ids="resolve_run"))

    def execute(self, context: Any) -> dict[str, Any]:
        from interlude.training import tasks as lifecycle

        spec = self._spec(context)
        validated = context["ti"].xcom_pull(task_ids="validate_runtime")
        report = context["ti"].xcom_pull(task_ids="choose.evaluate_capacity")
        lifecycle.start_fresh(spec)
        decision = dict(validated["decision"])
        if spec.spot:
            decision["mode"] = "spot"
        state = {
            "decision": decision,
            "runtime": validated["runtime"],
            "report": report,
            "tried": [],
            "quota_deadline": time.time() + spec.quota_wait_seconds,
        }
        return self._attempt(context, spec, state)

    def _attempt(self, context: Any, spec: Any, state: dict[str, Any]) -> dict[str, Any]:
        from interlude.training import tasks as lifecycle
        from interlude.triggers.provision import QuotaWaitTrigger

        held = lifecycle.take_machine_slot(spec, state)
        if held is not None:
            wait = min(30.0, spec.poll_seconds * 10)
            self.log.warning("%s: waiting %.0fs in the triggerer for a machine slot to free", held, wait)
            self.defer(trigger=QuotaWaitTrigger(seconds=wait, state=state), method_name="quota_waited")
        outcome = lifecycle.create_or_queue(spec, state)
        if outcome.machine is not None and not outcome.queued:
            return outcome.machine
        if outcome.queued:
            machine = outcome.machine
            assert machine is not None
            from interlude.machines.provisioning import QUEUE_GRACE_SECONDS
            from interlude.naming import queued_resource_id
            from interlude.triggers.provision import QueuedResourceTrigger

            qr_id = queued_resource_id(machine)
            self.log.info("Queued resource %s accepted: waiting for capacity in the triggerer", qr_id)
            trigger = QueuedResourceTrigger(
                zone=machine["zone"],
                queued_resource=qr_id,
                node_id=machine["name"],
                gcp_conn_id=self.gcp_conn_id,
                deadline=time.time() + spec.queue_wait_seconds + QUEUE_GRACE_SECONDS,
                poll_interval=min(self.poll_interval, spec.poll_seconds * 4),
                machine=machine,
            )
            self.defer(trigger=trigger, method_name="queued_complete")
        wait = min(30.0, spec.poll_seconds * 10)
        self.log.warning("Quota exhausted (%s): waiting %.0fs in the triggerer, then trying again", outcome.quota, wait)
        self.defer(trigger=QuotaWaitTrigger(seconds=wait, state=outcome.state), method_name="quota_waited")
        raise AssertionError("unreachable")  # defer() raises

    def quota_waited(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        return self._attempt(context, self._spec(context), event["state"])

    def queued_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        from interlude.machines import provisioning

        machine = event["machine"]
        if event.get("status") == "ready":
            self.log.info("Machine ready through its queued resource: %s in %s", machine["name"], machine["zone"])
            return machine
        self.log.error("Queued resource failed (%s); deleting it", event.get("message"))
        try:
            provisioning.delete(machine, self.gcp_conn_id)
        except Exception:
            self.log.exception("Clean-up of %s failed too (teardown will retry)", machine["name"])
        raise AirflowException(f"provision: queued resource for {machine['name']}: {event.get('message')}")
