"""The Job controller (batch/v1), as kube-controller-manager's runs it
(https://kubernetes.io/docs/concepts/workloads/controllers/job/):

- the API server has made the selector and the template's job labels (job_api.generate_selector);
- pods from the template, at most `parallelism` active, until `completions` succeeded; Indexed jobs give each
  pod its index (label and annotation `batch.kubernetes.io/job-completion-index`, env `JOB_COMPLETION_INDEX`,
  hostname `<job>-<index>`, name `<job>-<index>-<random>`), one success per index;
- every pod has a controller ownerReference (controller, blockOwnerDeletion): the garbage collector
  (`garbage_collector.py`) deletes the pods of a deleted Job, or orphans them (propagationPolicy Orphan);
- a Job being deleted (`deletionTimestamp`, e.g. a Foreground delete waiting for its pods) gets no new pods
  and no status writes, as the real controller leaves a Job in deletion alone;
- a failed pod, a container restart (restartPolicy OnFailure), and a pod deleted before it finished (an
  eviction, a node maintenance) count against `backoffLimit`; past it the Job gets `FailureTarget` then
  `Failed` (reason BackoffLimitExceeded) and its active pods are deleted; done, it gets `SuccessCriteriaMet`
  then `Complete` (reason CompletionsReached), as Kubernetes 1.31+ report them;
- status: active, ready, succeeded, failed, startTime, completionTime, completedIndexes (Indexed).
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass, field
from typing import Any

from interlude_localcloud.gke import defaults
from interlude_localcloud.gke.control_loop import ControlLoop, controller_uid, deleting, owner_reference
from interlude_localcloud.gke.deployments import is_ready
from interlude_localcloud.gke.resources import RESOURCES
from interlude_localcloud.gke.store import Store, now

JOBS = next(r for r in RESOURCES if r.plural == "jobs")
PODS = next(r for r in RESOURCES if r.plural == "pods")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def finished(job: dict[str, Any]) -> str | None:
    """ "Complete" or "Failed" once the Job has that condition True."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _index(pod: dict[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(COMPLETION_INDEX)
    return int(value) if value is not None and str(value).isdigit() else None


def _restarts(pod: dict[str, Any]) -> int:
    return sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])


def _ranges(indexes: set[int]) -> str:
    """completedIndexes as the API writes them: "0-2,5"."""
    spans: list[list[int]] = []
    for i in sorted(indexes):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _condition(ctype: str, reason: str, message: str) -> dict[str, Any]:
    stamp = now()
    return {
        "type": ctype,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": stamp,
        "lastTransitionTime": stamp,
    }


@dataclass
class _Seen:
    """What the controller has counted for one Job (the job-tracking finalizer's role on Kubernetes): a pod
    is counted once, even after it is deleted."""

    active: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    succeeded: set[str] = field(default_factory=set)
    indexes: set[int] = field(default_factory=set)


class JobController(ControlLoop):
    def __init__(self, store: Store) -> None:
        super().__init__(store, (JOBS, PODS), self.reconcile_all, "gke-job-controller")
        self.seen: dict[str, _Seen] = {}

    def reconcile_all(self) -> None:
        jobs, _ = self.store.list(JOBS, None)
        by_uid = {j["metadata"]["uid"]: j for j in jobs}
        pods, _ = self.store.list(PODS, None)
        for job in jobs:
            owned = [p for p in pods if controller_uid(p, "Job") == job["metadata"]["uid"]]
            self.sync_job(job, owned)
        for uid in [u for u in self.seen if u not in by_uid]:
            del self.seen[uid]

    def sync_job(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        if deleting(job):
            return
        seen = self.seen.setdefault(job["metadata"]["uid"], _Seen())
        spec = job.get("spec") or {}
        indexed = spec.get("completionMode") == "Indexed"
        present = {p["metadata"]["uid"] for p in pods}
        for p in pods:
            uid, phase = p["metadata"]["uid"], _phase(p)
            if phase == "Succeeded" and uid not in seen.succeeded:
                seen.succeeded.add(uid)
                if indexed and _index(p) is not None:
                    seen.indexes.add(int(_index(p) or 0))
            elif phase == "Failed":
                seen.failed.add(uid)
        # A pod deleted before it finished (evicted, its node gone) failed: the job-tracking finalizer's count.
        seen.failed |= {u for u in seen.active if u not in present and u not in seen.succeeded}
        active = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")]
        seen.active = {p["metadata"]["uid"] for p in active}
        status = copy.deepcopy(job.get("status") or {})
        done = finished(job)
        if done is None:
            done = self._progress(job, seen, active)
        if done is not None or spec.get("suspend"):
            for p in active:
                self.delete(PODS, p)
            active = []
        self.write_status(JOBS, job, self._status(job, status, seen, active, done))

    def _progress(self, job: dict[str, Any], seen: _Seen, active: list[dict[str, Any]]) -> str | None:
        """Create the pods still wanted; the terminal condition reached, if any."""
        spec = job["spec"]
        completions = spec.get("completions")
        parallelism = int(spec.get("parallelism", 1))
        failures = len(seen.failed) + sum(_restarts(p) for p in active)
        if failures > int(spec.get("backoffLimit", 6)):
            return "Failed"
        if spec.get("completionMode") == "Indexed":
            if len(seen.indexes) >= int(completions or 0):
                return "Complete"
            running = {_index(p) for p in active}
            todo = [i for i in range(int(completions or 0)) if i not in seen.indexes and i not in running]
            for i in todo[: max(parallelism - len(active), 0)]:
                self._create_pod(job, i)
            return None
        if completions is None:
            if seen.succeeded and not active:
                return "Complete"
            want = 0 if seen.succeeded else parallelism - len(active)
        else:
            if len(seen.succeeded) >= int(completions):
                return "Complete"
            want = min(parallelism, int(completions) - len(seen.succeeded)) - len(active)
        for _ in range(max(want, 0)):
            self._create_pod(job, None)
        return None

    def _create_pod(self, job: dict[str, Any], index: int | None) -> None:
        template = copy.deepcopy(job["spec"].get("template") or {})
        meta = template.get("metadata") or {}
        name = job["metadata"]["name"]
        suffix = "".join(secrets.choice(_ALPHABET) for _ in range(5))
        labels, annotations = dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})
        spec = template.get("spec") or {}
        if index is not None:
            labels[COMPLETION_INDEX] = annotations[COMPLETION_INDEX] = str(index)
            spec["hostname"] = f"{name}-{index}"
            ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
            for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
                env = c.setdefault("env", [])
                if not any(e.get("name") == "JOB_COMPLETION_INDEX" for e in env):
                    env.insert(0, {"name": "JOB_COMPLETION_INDEX", "valueFrom": ref})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{index}-{suffix}" if index is not None else f"{name}-{suffix}",
                "generateName": f"{name}-{index}-" if index is not None else f"{name}-",
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner_reference(job)],
            },
            "spec": spec,
        }
        defaults.apply(PODS, pod)
        self.store.create(PODS, job["metadata"]["namespace"], pod)

    def _status(
        self, job: dict[str, Any], status: dict[str, Any], seen: _Seen, active: list[dict[str, Any]], done: str | None
    ) -> dict[str, Any]:
        out = {
            k: v
            for k, v in status.items()
            if k in ("conditions", "startTime", "completionTime") and (k != "conditions" or v)
        }
        if not job["spec"].get("suspend"):
            out.setdefault("startTime", now())
        out.update(active=len(active), ready=sum(is_ready(p) for p in active))
        out.update(succeeded=len(seen.succeeded), failed=len(seen.failed), terminating=0)
        out["uncountedTerminatedPods"] = {}
        if job["spec"].get("completionMode") == "Indexed" and seen.indexes:
            out["completedIndexes"] = _ranges(seen.indexes)
        for k in ("active", "succeeded", "failed", "terminating"):
            if out[k] == 0:
                del out[k]
        if done is not None and not finished(job):
            if done == "Failed":
                out["conditions"] = [
                    *out.get("conditions", []),
                    _condition("FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                    _condition("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                ]
            else:
                out["conditions"] = [
                    *out.get("conditions", []),
                    _condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"),
                    _condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
                ]
                out["completionTime"] = now()
        return out
