"""The JobSet controller (jobset.x-k8s.io/v1alpha2), following pkg/controllers/jobset_controller.go,
failure_policy.go and success_policy.go of github.com/kubernetes-sigs/jobset (the way GKE runs TPU training:
https://cloud.google.com/kubernetes-engine/docs/tutorials/tpu-multislice-jobset):

- each replicatedJob gives `replicas` child Jobs named `<jobset>-<replicatedJob>-<index>`, their template
  plus the `jobset.sigs.k8s.io/*` labels and annotations `labelAndAnnotateObject` sets (jobset-name,
  jobset-uid, replicatedjob-name, restart-attempt, replicatedjob-replicas, global-replicas, job-index,
  job-key, job-global-index, group-name, group-replicas, job-group-index) on the Job and its pod template,
  and a controller ownerReference;
- `network.enableDNSHostnames`: a headless Service named after the subdomain (default the JobSet's name)
  selecting `jobset.sigs.k8s.io/jobset-name`, and the pods' `subdomain` set to it;
- a failed child Job runs the failure policy: none -> the JobSet fails (FailedJobs); the first matching rule's
  action (default RestartJobSet) -> `status.restarts` +1 (and `restartsCountTowardsMax` unless
  RestartJobSetAndIgnoreMaxRestarts) until maxRestarts, then Failed (ReachedMaxRestarts); Jobs whose
  `restart-attempt` label is below `status.restarts` are deleted and recreated with the new attempt;
- the success policy (operator All/Any over targetReplicatedJobs) marks it Completed (AllJobsCompleted);
  a finished JobSet's active Jobs are deleted;
- the controller deletes Jobs with propagationPolicy Foreground, skipping those already being deleted
  (`deleteJobs`): an old attempt's Job stays, making no pods, until its pods are gone, and only then is its
  name free for the new attempt;
- child Jobs and the Service carry a controller ownerReference, so the garbage collector
  (`garbage_collector.py`) makes a Foreground or Background delete of the JobSet take them (and the Jobs'
  pods) with it, and an Orphan delete leave them.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from interlude_localcloud.gke import defaults
from interlude_localcloud.gke.control_loop import ControlLoop, controller_uid, deleting, owner_reference
from interlude_localcloud.gke.jobs import JOBS, finished
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store, now

JOBSETS = next(r for r in RESOURCES if r.plural == "jobsets")
SERVICES = next(r for r in RESOURCES if r.plural == "services")
P = "jobset.sigs.k8s.io/"
JOBSET_NAME, JOBSET_UID, REPLICATED_JOB = P + "jobset-name", P + "jobset-uid", P + "replicatedjob-name"
RESTART_ATTEMPT = P + "restart-attempt"
MESSAGES = {  # pkg/constants/constants.go
    "FailedJobs": "jobset failed due to one or more job failures",
    "ReachedMaxRestarts": "jobset failed due to reaching max number of restarts",
    "FailJobSetFailurePolicyAction": "applying FailJobSet failure policy action",
    "RestartJobSet": "applying RestartJobSet failure policy action",
    "RestartJobSetAndIgnoreMaxRestarts": "applying RestartJobSetAndIgnoreMaxRestarts failure policy action",
}


def subdomain(js: dict[str, Any]) -> str:
    return str((js["spec"].get("network") or {}).get("subdomain") or js["metadata"]["name"])


def dns_hostnames(js: dict[str, Any]) -> bool:
    return bool((js["spec"].get("network") or {}).get("enableDNSHostnames"))


def _rjobs(js: dict[str, Any]) -> list[dict[str, Any]]:
    return list(js["spec"].get("replicatedJobs") or [])


def _replicas(rjob: dict[str, Any]) -> int:
    return int(rjob.get("replicas", 1))


def _group(rjob: dict[str, Any]) -> str:
    return str(rjob.get("groupName") or "default")


def labels_for(js: dict[str, Any], rjob: dict[str, Any], index: int) -> dict[str, str]:
    """labelAndAnnotateObject: the same keys go on as labels and as annotations."""
    rjobs, ns, name = _rjobs(js), js["metadata"]["namespace"], js["metadata"]["name"]
    job_name = f"{name}-{rjob['name']}-{index}"
    before = [r for r in rjobs[: next(i for i, r in enumerate(rjobs) if r["name"] == rjob["name"])]]
    group = [r for r in rjobs if _group(r) == _group(rjob)]
    group_before = [r for r in before if _group(r) == _group(rjob)]
    return {
        JOBSET_NAME: name,
        JOBSET_UID: js["metadata"]["uid"],
        REPLICATED_JOB: rjob["name"],
        RESTART_ATTEMPT: str(int((js.get("status") or {}).get("restarts") or 0)),
        P + "replicatedjob-replicas": str(_replicas(rjob)),
        P + "global-replicas": str(sum(_replicas(r) for r in rjobs)),
        P + "job-index": str(index),
        P + "job-key": hashlib.sha1(f"{ns}/{job_name}".encode()).hexdigest(),
        P + "job-global-index": str(sum(_replicas(r) for r in before) + index),
        P + "group-name": _group(rjob),
        P + "group-replicas": str(sum(_replicas(r) for r in group)),
        P + "job-group-index": str(sum(_replicas(r) for r in group_before) + index),
    }


def _condition(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": now()}


def _set_condition(status: dict[str, Any], cond: dict[str, Any]) -> None:
    conds = [c for c in status.get("conditions") or [] if c.get("type") != cond["type"]]
    prev = next((c for c in status.get("conditions") or [] if c.get("type") == cond["type"]), None)
    if prev is not None and prev.get("status") == cond["status"]:
        cond["lastTransitionTime"] = prev.get("lastTransitionTime", cond["lastTransitionTime"])
    status["conditions"] = [*conds, cond]


def jobset_finished(js: dict[str, Any]) -> bool:
    return any(
        c.get("type") in ("Completed", "Failed") and c.get("status") == "True"
        for c in (js.get("status") or {}).get("conditions") or []
    )


def _restart_attempt(job: dict[str, Any]) -> int:
    value = (job["metadata"].get("labels") or {}).get(RESTART_ATTEMPT, "0")
    return int(value) if str(value).isdigit() else 0


class JobSetController(ControlLoop):
    def __init__(self, store: Store) -> None:
        super().__init__(store, (JOBSETS, JOBS), self.reconcile_all, "gke-jobset-controller")

    def reconcile_all(self) -> None:
        jobsets, _ = self.store.list(JOBSETS, None)
        jobs, _ = self.store.list(JOBS, None)
        for js in jobsets:
            owned = [j for j in jobs if controller_uid(j, "JobSet") == js["metadata"]["uid"]]
            self.sync_jobset(js, owned)

    def sync_jobset(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        if deleting(js):
            return
        status = copy.deepcopy(js.get("status") or {})
        status.setdefault("restarts", 0)
        restarts = int(status["restarts"])
        previous = [j for j in jobs if _restart_attempt(j) < restarts]
        current = [j for j in jobs if j not in previous]
        failed = [j for j in current if finished(j) == "Failed"]
        successful = [j for j in current if finished(j) == "Complete"]
        active = [j for j in current if finished(j) is None]
        status["replicatedJobsStatus"] = self._rjob_statuses(js, current)
        if jobset_finished(js):
            for j in active:
                self.delete(JOBS, j, "Foreground")
            self.write_status(JOBSETS, js, status)
            return
        for j in previous:
            self.delete(JOBS, j, "Foreground")
        _jobs_ready_again(js, status)
        if failed:
            self._failure_policy(js, status, failed)
        elif not (successful and self._succeeded(js, status, successful)):
            self._create_missing(js, {j["metadata"]["name"] for j in jobs})
        self.write_status(JOBSETS, js, status)

    def _create_missing(self, js: dict[str, Any], names: set[str]) -> None:
        """Jobs not there (by name, any attempt: one being deleted is replaced once it is gone) and the Service."""
        if dns_hostnames(js):
            self._headless_service(js)
        for rjob in _rjobs(js):
            for index in range(_replicas(rjob)):
                if f"{js['metadata']['name']}-{rjob['name']}-{index}" not in names:
                    self._create_job(js, rjob, index)

    def _rjob_statuses(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for rjob in _rjobs(js):
            mine = [j for j in jobs if (j["metadata"].get("labels") or {}).get(REPLICATED_JOB) == rjob["name"]]
            ready = 0
            for j in mine:
                st, spec = j.get("status") or {}, j.get("spec") or {}
                want = min(int(spec.get("parallelism", 1)), int(spec.get("completions") or spec.get("parallelism", 1)))
                ready += int(finished(j) is None and int(st.get("ready") or 0) + int(st.get("succeeded") or 0) >= want)
            out.append(
                {
                    "name": rjob["name"],
                    "ready": ready,
                    "succeeded": sum(finished(j) == "Complete" for j in mine),
                    "failed": sum(finished(j) == "Failed" for j in mine),
                    "active": sum(
                        finished(j) is None and int((j.get("status") or {}).get("active") or 0) > 0 for j in mine
                    ),
                    "suspended": sum(bool((j.get("spec") or {}).get("suspend")) for j in mine),
                }
            )
        return out

    def _succeeded(self, js: dict[str, Any], status: dict[str, Any], successful: list[dict[str, Any]]) -> bool:
        policy = js["spec"].get("successPolicy") or {"operator": "All"}
        targets = policy.get("targetReplicatedJobs") or [r["name"] for r in _rjobs(js)]
        matching = [j for j in successful if (j["metadata"].get("labels") or {}).get(REPLICATED_JOB) in targets]
        expected = (
            1 if policy.get("operator") == "Any" else sum(_replicas(r) for r in _rjobs(js) if r["name"] in targets)
        )
        if len(matching) < expected:
            return False
        _set_condition(status, _condition("Completed", "True", "AllJobsCompleted", "jobset completed successfully"))
        status["terminalState"] = "Completed"
        return True

    def _failure_policy(self, js: dict[str, Any], status: dict[str, Any], failed: list[dict[str, Any]]) -> None:
        policy = js["spec"].get("failurePolicy")
        first = min(failed, key=_failed_at)
        if policy is None:
            self._fail(status, "FailedJobs", first)
            return
        rule, job = _matching_rule(policy.get("rules") or [], failed)
        job = job or first
        action = (rule or {}).get("action", "RestartJobSet")
        if action == "FailJobSet":
            self._fail(status, "FailJobSetFailurePolicyAction", job)
            return
        counts = action not in ("RestartJobSetAndIgnoreMaxRestarts", "RestartJobAndIgnoreMaxRestarts")
        if counts and int(status.get("restartsCountTowardsMax") or 0) >= int(policy.get("maxRestarts") or 0):
            self._fail(status, "ReachedMaxRestarts", job)
            return
        status["restarts"] = int(status.get("restarts") or 0) + 1
        if counts:
            status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
        message = MESSAGES.get(action, MESSAGES["RestartJobSet"])
        reason = f"FailurePolicy_{rule['name']}" if rule else "DefaultFailurePolicy"
        cond = _condition(
            "RestartingJobSet", "True", reason, f"{message} (first failed job: {job['metadata']['name']})"
        )
        _set_condition(status, cond)

    def _fail(self, status: dict[str, Any], reason: str, job: dict[str, Any]) -> None:
        message = f"{MESSAGES[reason]} (first failed job: {job['metadata']['name']})"
        _set_condition(status, _condition("Failed", "True", reason, message))
        status["terminalState"] = "Failed"

    def _headless_service(self, js: dict[str, Any]) -> None:
        ns, name = js["metadata"]["namespace"], subdomain(js)
        if self.store.exists(SERVICES, ns, name):
            return
        svc = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner_reference(js)]},
            "spec": {
                "clusterIP": "None",
                "selector": {JOBSET_NAME: js["metadata"]["name"]},
                "publishNotReadyAddresses": bool(
                    (js["spec"].get("network") or {}).get("publishNotReadyAddresses", True)
                ),
            },
        }
        defaults.apply(SERVICES, svc)
        try:
            self.store.create(SERVICES, ns, svc)
        except KubeError:
            pass

    def _create_job(self, js: dict[str, Any], rjob: dict[str, Any], index: int) -> None:
        template = copy.deepcopy(rjob.get("template") or {})
        meta = template.get("metadata") or {}
        spec = template.get("spec") or {}
        marks = labels_for(js, rjob, index)
        pod_template = spec.setdefault("template", {})
        pod_meta = pod_template.setdefault("metadata", {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **marks}
        pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **marks}
        if dns_hostnames(js):
            pod_template.setdefault("spec", {})["subdomain"] = subdomain(js)
        spec["suspend"] = bool(js["spec"].get("suspend"))
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": f"{js['metadata']['name']}-{rjob['name']}-{index}",
                "labels": {**(meta.get("labels") or {}), **marks},
                "annotations": {**(meta.get("annotations") or {}), **marks},
                "ownerReferences": [owner_reference(js)],
            },
            "spec": spec,
        }
        defaults.apply(JOBS, job)
        try:
            self.store.create(JOBS, js["metadata"]["namespace"], job)
        except KubeError:
            self._wake.set()


def _jobs_ready_again(js: dict[str, Any], status: dict[str, Any]) -> None:
    """After a restart, RestartingJobSet turns False (JobsReady) once every child Job is ready."""
    conds = status.get("conditions") or []
    if not any(c.get("type") == "RestartingJobSet" and c.get("status") == "True" for c in conds):
        return
    pairs = zip(status["replicatedJobsStatus"], _rjobs(js), strict=True)
    if all(r["ready"] + r["succeeded"] >= _replicas(rjob) for r, rjob in pairs):
        _set_condition(status, _condition("RestartingJobSet", "False", "JobsReady", "all jobs are ready"))


def _failed_at(job: dict[str, Any]) -> str:
    conds = (job.get("status") or {}).get("conditions") or []
    return next((str(c.get("lastTransitionTime")) for c in conds if c.get("type") == "Failed"), "")


def _matching_rule(
    rules: list[dict[str, Any]], failed: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The first rule (in order) that applies to a failed Job: its targetReplicatedJobs and
    onJobFailureReasons (the Job's Failed condition reason) match, empty meaning any."""
    for rule in rules:
        for job in sorted(failed, key=_failed_at):
            rjob = (job["metadata"].get("labels") or {}).get(REPLICATED_JOB)
            reason = next(
                (
                    c.get("reason")
                    for c in (job.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Failed"
                ),
                None,
            )
            targets, reasons = rule.get("targetReplicatedJobs") or [], rule.get("onJobFailureReasons") or []
            if (not targets or rjob in targets) and (not reasons or reason in reasons):
                return rule, job
    return None, None
