"""The serving DAG's maintenance watch step, the Google provider's way: the operator defers to
`MaintenanceWatchTrigger` (which polls asynchronously and yields one event) and `execute_complete` fails
loudly on anything but done. `watch_minutes` = 0 skips the step: nothing is watched, nothing deferred."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk.exceptions import AirflowException

from interlude.operators.serving import ServingBaseOperator

#: After `watch_minutes`, a maintenance already being handled may finish for at most this long (seconds,
#: real): long enough for a replacement replica to start and a drained node to come back, never forever.
FINISH_GRACE_SECONDS = 900.0


class ServingMaintenanceOperator(ServingBaseOperator):
    """Watch the serving nodes for host maintenance for `watch_minutes` (optionally under a bounded load).

    The spec's ``watch_minutes`` (0: skip, return ``{"skipped": True}``) is wall-clock time; maintenance still
    in flight then may finish for up to ``FINISH_GRACE_SECONDS`` more before the task fails as a timeout.

    :param spec: the ServeSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param spec_task_id: the task whose XCom holds the ServeSpec.
    :param gcp_conn_id: the Google connection GKEHook reaches the spec's cluster through (credentials, project,
        the ``container_endpoint`` and ``time_scale`` extras).
    """

    ui_color = "#e2e3e5"

    def execute(self, context: Any) -> dict[str, Any] | None:
        from interlude.triggers.serving_maintenance import MaintenanceWatchTrigger

        spec = self.serve_spec(context)
        if spec.watch_minutes <= 0:
            self.log.info("watch_minutes is 0: no maintenance watch")
            return {"skipped": True}
        kwargs = self.trigger_kwargs(spec, spec.watch_minutes * 60 + FINISH_GRACE_SECONDS)
        watch_until = time.time() + spec.watch_minutes * 60
        self.log.info(
            "Watching for node maintenance for %.1f min (load: %d requests, %d at a time)",
            spec.watch_minutes,
            spec.load_requests,
            spec.load_concurrency,
        )
        since = str((context["ti"].xcom_pull(task_ids="apply") or {}).get("pods_rv") or "")
        self.defer(
            trigger=MaintenanceWatchTrigger(
                spec=spec.to_dict(),
                watch_until=watch_until,
                pods_since=since,
                time_scale=float(self.gke_hook(spec)._get_field("time_scale", None) or 1.0),
                **kwargs,
            ),
            method_name="execute_complete",
        )
        return None

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        for d in (event or {}).get("decisions") or []:
            self.log.info("decision %s %s: %s %s", d["kind"], d["node"], d["reason"], d.get("outcome") or "")
        if not event or event.get("status") != "done":
            status = (event or {}).get("status", "no event")
            detail = (event or {}).get("message") or "; ".join((event or {}).get("in_flight") or [])
            raise AirflowException(f"maintenance watch {status}: {detail}")
        load = event.get("load")
        if load:
            self.log.info("load: %s", load)
            if load["failed"]:
                self.log.warning("%d request(s) failed during the watch: %s", load["failed"], load["failures"])
        return event
