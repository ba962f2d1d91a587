"""The sweeper on GKE: the node pools (and JobSets) of finished runs in the clusters it is told to look in.

A backstop for a run's own teardown, as the zone sweep is for VMs (interlude.machines.sweeper): a run's node pool
carries ``managed-by=interlude`` and ``interlude-run=<run_key>`` in its node config's labels, and the Airflow run in
its node config's metadata (``interlude-dag-id`` / ``interlude-run-id``, written by interlude.machines.gke); the
same pure verdict decides (delete only when Airflow says the run is over, never on an unknown), and the run's own
GKE teardown deletes it (its JobSet in the foreground, every pool of the run, listed again). Clusters are named
``LOCATION/CLUSTER``: node pools are per cluster, and the sweeper is not given the runs' params.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

from interlude.machines import gke, sweeper
from interlude.machines.teardown import TeardownReport

log = logging.getLogger(__name__)

#: ``LOCATION/CLUSTER``: a region or zone, then a GKE cluster name (Google's shapes).
CLUSTER_RE = re.compile(r"^[a-z]+-[a-z]+\d+(-[a-z])?/[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


def sweep_clusters(clusters: Iterable[str], state_of: Any, gcp_conn_id: str) -> TeardownReport:
    """Delete what finished runs left in each ``LOCATION/CLUSTER``; a cluster that cannot be listed is said, and
    the others are still swept. ``state_of((dag_id, run_id))`` asks Airflow (None: unknown, kept)."""
    report = TeardownReport(zones=list(clusters))
    for where in report.zones:
        location, cluster = where.split("/", 1)
        try:
            h = gke.hook(gcp_conn_id, location)
            parent = f"projects/{h.project_id}/locations/{location}/clusters/{cluster}"
            listed = h.get_cluster_manager_client().list_node_pools(parent=parent).node_pools
            pools = [type(p).to_dict(p) for p in listed]
        except Exception as exc:  # noqa: BLE001 - the other clusters still get swept
            report.unlisted[where] = f"{type(exc).__name__}: {exc}"
            continue
        found = [m for p in pools if (m := sweeper.labelled("gke_node_pool", where, p)) is not None]
        states = {m.run: state_of(m.run) for m in found if m.run}
        swept: set[str] = set()
        for v in sweeper.select(found, states):
            log.info("Sweeper: %s %s", v.machine.path(), v.reason)
            if not v.delete or v.machine.run_key in swept:
                continue
            swept.add(v.machine.run_key)  # the run's teardown takes every pool of the run at once
            run = SimpleNamespace(
                run_key=v.machine.run_key, gke_cluster=cluster, gke_location=location, poll_seconds=1.0
            )
            out = gke.teardown(run, gcp_conn_id)
            report.deleted += [f"{where}/{d}" for d in out.deleted]
            if out.problems:
                report.failed[v.machine.path()] = "; ".join(out.problems)
    return report
