"""WaitForCapacityOperator: the `wait` leaf of the decision trees, deferred until capacity shows."""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from interlude.training.spec import RunSpec
from interlude.triggers.capacity import CapacityTrigger


class WaitForCapacityOperator(BaseOperator):
    """Hold the run (in the triggerer, not on a worker) until the tree places it or gives up.

    Returns the new decision; a walk that ends `stuck` (the profile's wait deadline passed) fails the
    task with the tree's report of everything it checked (no retry can make capacity appear sooner).

    :param spec: the run's RunSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param decision: the decision that ended in ``wait``; None pulls it from ``decision_task_id`` (templated).
    :param poll_interval: seconds between two capacity probes; default five times the run's poll_seconds.
    :param spec_task_id: the task whose XCom holds the RunSpec.
    :param decision_task_id: the task whose XCom holds the decision.
    """

    template_fields = ("spec", "decision")
    template_fields_renderers = {"spec": "json", "decision": "json"}
    ui_color = "#fff3cd"

    def __init__(
        self,
        *,
        spec: Any = None,
        decision: Any = None,
        poll_interval: float | None = None,
        spec_task_id: str = "resolve_run",
        decision_task_id: str = "choose.decide",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.decision = decision
        self.spec_task_id = spec_task_id
        self.decision_task_id = decision_task_id
        self._poll_interval = poll_interval

    @property
    def poll_interval(self) -> float:
        """Capacity is probed five times less often than machines are watched (default 5 x poll_seconds)."""
        return self._poll_interval or 5 * RunSpec.from_dict(self.spec).poll_seconds

    def execute(self, context: Any) -> dict[str, Any]:
        # Pulled, not passed: the graph keeps one edge (the branch) into this leaf.
        if self.spec is None:
            self.spec = context["ti"].xcom_pull(task_ids=self.spec_task_id)
        if self.decision is None:
            self.decision = context["ti"].xcom_pull(task_ids=self.decision_task_id)
        self.log.info(
            "Waiting for capacity (deadline %s); re-evaluating every %.0fs",
            self.decision.get("wait_deadline"),
            self.poll_interval,
        )
        self.defer(
            trigger=CapacityTrigger(spec=self.spec, decision=self.decision, poll_interval=self.poll_interval),
            method_name="execute_complete",
        )
        raise AssertionError("unreachable")  # defer() raises

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("status") != "decided":
            raise AirflowException(f"waiting for capacity failed: {event.get('message', event)}")
        decision = event["decision"]
        if decision["leaf"] == "stuck":
            raise AirflowFailException(
                "Still no capacity at the wait deadline.\n\n" + str(decision.get("stuck_report"))
            )
        self.log.info(
            "Capacity found: %s -> %s in %s", decision["leaf"], decision.get("accelerator_type"), decision.get("zone")
        )
        return decision
