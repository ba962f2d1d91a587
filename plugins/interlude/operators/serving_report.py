"""The serving DAG's report step, and the apply step's "before" snapshot it is measured from.

Counted from the cluster's own records, never from the DAG's account of itself (`interlude.serving.observed`):
- pods over time: the pods at the apply (listed with their resourceVersion), then every change after it: the
  maintenance watch's pod watch, resumed here from where it stopped (or from the apply when no watch ran);
- requests per accelerator: each pod's access log (followed by the watch while the pod lived; read here for
  the pods still there), minus what a pod's log already held at the apply, by its node's accelerator.
What could not be counted (a pod whose log went with it unread, a 410 Gone resume, a cut timeline) is named
in the report.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from interlude.operators.serving import ServingBaseOperator
from interlude.operators.serving_records import list_pods, node_kinds, read_served, replay
from interlude.serving.observed import PodChange, Served, pod_change

if TYPE_CHECKING:  # ~0.5 CPU-s to import: the report task pays it, not every parse of the DAG
    from kubernetes import client


def _served(
    core: client.CoreV1Api, namespace: str, observed: dict[str, Any], pods_now: list[dict[str, Any]]
) -> dict[str, Served]:
    """Per pod: what the watch's log followers counted, raised to the log as it is now for the pods still there."""
    served = {k: Served(*v) for k, v in (observed.get("served") or {}).items()}
    for pod in pods_now:
        now = read_served(core, namespace, pod)
        seen = served.get(pod["metadata"]["name"])
        if now is not None and (seen is None or now.ok + now.failed >= seen.ok + seen.failed):
            served[pod["metadata"]["name"]] = now
    return served


def _changes(
    core: client.CoreV1Api, namespace: str, name: str, applied: dict[str, Any], observed: dict[str, Any]
) -> tuple[list[PodChange], list[str]]:
    """The watch's changes, then those after it (replayed here), and what could not be seen."""
    changes = [PodChange.from_dict(c) for c in observed.get("changes") or []]
    notes = [str(g) for g in observed.get("gaps") or []]
    since = str(observed.get("rv") or applied.get("pods_rv") or "")
    if not since:
        return changes, [*notes, "pods over time: the apply step recorded no resourceVersion: changes not watched"]
    more, gaps = replay(core, namespace, name, since)
    return changes + more, notes + gaps


def build(core: client.CoreV1Api, namespace: str, name: str, xcoms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report's figures and text from the steps' XComs (apply, rollout, maintenance_watch) and the cluster."""
    from interlude.serving import observed as obs
    from interlude.serving.policy import FallbackPlan, PodObs
    from interlude.serving.report import FallbackRecord, build_report

    applied, observed = xcoms["apply"], xcoms["maintenance_watch"].get("observed") or {}
    initial = [PodChange.from_dict(c) for c in applied.get("pods_at_start") or []]
    changes, notes = _changes(core, namespace, name, applied, observed)
    _, pods_now = list_pods(core, namespace, name)
    now = [pod_change("MODIFIED", p, time.time()) for p in pods_now]
    every = initial + changes + now
    kinds = node_kinds(core, dict(observed.get("nodes") or {}), {c.node for c in every if c.node})
    started_at = float(applied.get("started_at") or time.time())
    served = _served(core, namespace, observed, pods_now)
    baseline = {k: Served(*v) for k, v in (applied.get("served_before") or {}).items()}
    per = obs.requests_per_accelerator(served, baseline, obs.nodes_of(every), kinds)
    missed = obs.uncounted(obs.ran(every), served)
    if missed:
        notes.append(f"requests of {len(missed)} pod(s) not counted (their logs went unread): {', '.join(missed[:10])}")
    first_ready: dict[str, float] = {}
    for c in sorted(initial + changes, key=lambda c: c.rv):
        if c.ready:
            first_ready.setdefault(c.name, c.at)
    fallbacks = [
        FallbackRecord(float(r["at"]), FallbackPlan(r["action"], r["order"], r["reason"], tuple(r["stuck_pods"])))
        for r in xcoms["rollout"].get("fallbacks") or []
    ]
    if not applied.get("changed") and initial:  # a re-run applied nothing: time the pods that were there
        started_at = min([started_at, *(c.at for c in initial)])
    report = build_report(
        started_at,
        obs.timeline(started_at, initial, changes, kinds),
        [PodObs(pod, "Running", True, ready_at=at) for pod, at in first_ready.items()],
        fallbacks,
        {k: (v.ok, v.failed) for k, v in per.items()},
        notes,
    )
    ready_now: dict[str, int] = {}
    for c in now:
        kind = kinds.get(c.node or "")
        if c.ready and kind:
            ready_now[kind] = ready_now.get(kind, 0) + 1
    return {
        "text": report.render_text() + watch_lines(xcoms["maintenance_watch"]),
        "pods_per_accelerator": ready_now,
        "first_ready_seconds": report.first_ready_seconds,
        "fallbacks": [{"at": f.at, "action": f.plan.action, "reason": f.plan.reason} for f in report.fallbacks],
        "requests_per_accelerator": {
            k: {"answered": v.answered, "failed": v.failed} for k, v in report.per_accelerator
        },
        "pods_over_time": [{"at": s.at, "rv": s.rv, "counts": dict(s.counts)} for s in report.samples],
        "notes": list(report.notes),
    }


class ServingReportOperator(ServingBaseOperator):
    """The serving report (interlude.serving.report) from the watch, the pods' logs and the rollout's fallbacks.

    Reads the ``apply``, ``rollout`` and ``maintenance_watch`` XComs and the cluster's own records; what could
    not be counted is named in the report's notes rather than guessed.

    :param spec: the ServeSpec as a dict; None pulls it from ``spec_task_id``'s XCom (templated).
    :param spec_task_id: the task whose XCom holds the ServeSpec.
    :param gcp_conn_id: the Google connection GKEHook reaches the spec's cluster through (credentials, project,
        the ``container_endpoint`` and ``time_scale`` extras).
    """

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.serve_spec(context)
        ti = context["ti"]
        xcoms = {t: ti.xcom_pull(task_ids=t) or {} for t in ("apply", "rollout", "maintenance_watch")}
        with self.objects(spec) as kube:
            from kubernetes import client as kube_client

            result = build(kube_client.CoreV1Api(kube.api_client), spec.namespace, spec.name, xcoms)
        self.log.info("%s", result["text"])
        return result


def watch_lines(watch: dict[str, Any] | None) -> str:
    """The maintenance watch's part of the report: its decisions, and the drill's load figures if it ran one."""
    from interlude.serving.loadgen import summary_lines

    if not watch or watch.get("skipped"):
        return ""
    lines = [f"  maintenance decisions: {len(watch.get('decisions') or [])}"]
    lines += [
        f"    {d['kind']} {d['node']}: {d['reason']}" for d in watch.get("decisions") or [] if d["kind"] != "wait"
    ]
    if watch.get("load"):
        lines += summary_lines(watch["load"])
    return "\n".join(lines) + "\n"
