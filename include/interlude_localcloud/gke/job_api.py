"""What the API server (and, for JobSets, the JobSet webhook) does to Jobs and JobSets at admission:
defaults and the semantic checks a schema cannot say.

- Job defaults (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/job-v1/): parallelism
  and completions 1 when both are unset, backoffLimit 6, completionMode NonIndexed, suspend false,
  podReplacementPolicy TerminatingOrFailed; the pod template is defaulted like a Pod's.
- Job selector: unless `manualSelector`, the Job strategy's Validate (pkg/registry/batch/job/strategy.go,
  `generateSelector`, run once the uid is assigned) sets spec.selector to `batch.kubernetes.io/controller-uid`
  and adds it, `batch.kubernetes.io/job-name`, `controller-uid` and `job-name` to the template's labels.
- Job validation: the template's restartPolicy must be OnFailure or Never
  (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-template).
- JobSet defaults: what the JobSet mutating webhook sets (pkg/webhooks/jobset_webhook.go `Default` in
  github.com/kubernetes-sigs/jobset): successPolicy operator All, startupPolicy AnyOrder, each replicated
  Job Indexed with pod restartPolicy OnFailure, network.enableDNSHostnames and publishNotReadyAddresses true,
  failure policy rules named `failurePolicyRule<i>`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

PodSpecDefaults = Callable[[dict[str, Any]], None]


def job_defaults(obj: dict[str, Any], pod_spec: PodSpecDefaults) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    if spec.get("parallelism") is None and spec.get("completions") is None:
        spec["parallelism"] = spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if not spec.get("podFailurePolicy"):
        spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    template_spec = (spec.get("template") or {}).get("spec")
    if isinstance(template_spec, dict):
        pod_spec(template_spec)  # without restartPolicy: a Job has no default for it (validation asks for one)


def jobset_defaults(obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    spec.setdefault("successPolicy", {"operator": "All"})
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for rjob in spec.get("replicatedJobs") or []:
        job_spec = ((rjob or {}).get("template") or {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = (job_spec.setdefault("template", {})).setdefault("spec", {})
        if isinstance(pod_spec, dict):
            pod_spec.setdefault("restartPolicy", "OnFailure")
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if isinstance(rule, dict) and not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"


LABEL_CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
LABEL_JOB_NAME = "batch.kubernetes.io/job-name"


def generate_selector(obj: dict[str, Any]) -> None:
    """As `generateSelector` does it: labels the user set stay (a conflict is then the validation's), and
    the selector gains `batch.kubernetes.io/controller-uid` only when it lacks it. So the pass is a no-op on
    a stored Job, and a changed selector reaches the update check (`validation.IMMUTABLE`) as a 422."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec")
    uid, name = meta.get("uid"), meta.get("name")
    if not isinstance(spec, dict) or spec.get("manualSelector") or not uid or not name:
        return
    template = spec.setdefault("template", {})
    if isinstance(template, dict):
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        for key, value in (
            (LABEL_JOB_NAME, name),
            ("job-name", name),
            (LABEL_CONTROLLER_UID, uid),
            ("controller-uid", uid),
        ):
            labels.setdefault(key, value)
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        selector = spec["selector"] = {}
    match = selector.get("matchLabels")
    if not isinstance(match, dict):
        match = selector["matchLabels"] = {}
    match.setdefault(LABEL_CONTROLLER_UID, uid)


def job_causes(spec: dict[str, Any]) -> list[dict[str, str]]:
    """The API server's Job checks that the schema cannot express (ValidateJobSpec)."""
    out: list[dict[str, str]] = []
    template_spec = (spec.get("template") or {}).get("spec") or {}
    restart = template_spec.get("restartPolicy")
    if restart not in ("OnFailure", "Never"):
        out.append(
            {
                "reason": "FieldValueRequired" if restart is None else "FieldValueNotSupported",
                "field": "spec.template.spec.restartPolicy",
                "message": 'Required value: valid values: "OnFailure", "Never"'
                if restart is None
                else f'Unsupported value: "{restart}": supported values: "OnFailure", "Never"',
            }
        )
    for key in ("parallelism", "completions", "backoffLimit"):
        if isinstance(spec.get(key), int) and spec[key] < 0:
            out.append(
                {
                    "reason": "FieldValueInvalid",
                    "field": f"spec.{key}",
                    "message": f"Invalid value: {spec[key]}: must be greater than or equal to 0",
                }
            )
    if spec.get("completionMode") == "Indexed" and spec.get("completions") is None:
        out.append(
            {
                "reason": "FieldValueRequired",
                "field": "spec.completions",
                "message": "Required value: when completion mode is Indexed",
            }
        )
    return out
