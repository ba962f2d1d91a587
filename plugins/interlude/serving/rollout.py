"""Rollout, teardown and smoke decisions over Kubernetes JSON: pure, so the trigger, the operators and the
tests read the cluster the same way.

A rollout is complete when the Deployment controller has seen the newest spec (observedGeneration), every
desired replica is updated and available, and no pod of an older template is left - the same condition as
`kubectl rollout status` (https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#complete-deployment).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from interlude.serving.observe import accelerator_of, epoch

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class PodPlacement:
    name: str
    node: str | None
    accelerator: str | None  # "tpu", "gpu" or None (not scheduled / no accelerator label)
    ready: bool
    ready_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class RolloutState:
    done: bool
    reason: str  # why done or what is still missing (logged by the trigger)
    pods: tuple[PodPlacement, ...]

    def per_accelerator(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pods:
            if p.ready:
                key = p.accelerator or "none"
                out[key] = out.get(key, 0) + 1
        return out


def _ready(pod: Obj) -> tuple[bool, float | None]:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            ok = cond.get("status") == "True"
            return ok, epoch(cond.get("lastTransitionTime")) if ok else None
    return False, None


def placements(pods: Sequence[Obj], node_labels: Mapping[str, Mapping[str, str]]) -> tuple[PodPlacement, ...]:
    """Each pod with its node's accelerator kind, by name (deleted pods with a deletionTimestamp are left out)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        ready, ready_at = _ready(pod)
        out.append(
            PodPlacement(str(meta.get("name")), node, accelerator_of(node_labels.get(node or "", {})), ready, ready_at)
        )
    return tuple(sorted(out, key=lambda p: p.name))


def rollout_state(
    deployment: Obj | None, pods: Sequence[Obj], node_labels: Mapping[str, Mapping[str, str]]
) -> RolloutState:
    """Whether the Deployment's newest template is fully rolled out, and where its pods are."""
    placed = placements(pods, node_labels)
    if deployment is None:
        return RolloutState(False, "the Deployment does not exist", placed)
    meta, spec, status = deployment.get("metadata") or {}, deployment.get("spec") or {}, deployment.get("status") or {}
    want = int(spec.get("replicas", 1))
    if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 1):
        return RolloutState(False, "the Deployment controller has not seen the newest spec", placed)
    updated, available = int(status.get("updatedReplicas") or 0), int(status.get("availableReplicas") or 0)
    total = int(status.get("replicas") or 0)
    if updated < want:
        return RolloutState(False, f"{updated} of {want} replicas updated", placed)
    if total > updated:
        return RolloutState(False, f"{total - updated} old replicas pending termination", placed)
    if available < want:
        return RolloutState(False, f"{available} of {want} updated replicas available", placed)
    ready = sum(1 for p in placed if p.ready)
    if ready < want:
        return RolloutState(False, f"{ready} of {want} pods Ready", placed)
    per = RolloutState(True, "", placed).per_accelerator()
    on = ", ".join(f"{k}={v}" for k, v in sorted(per.items()))
    return RolloutState(True, f"{want} of {want} replicas Ready ({on})", placed)


def leftovers(pods: Sequence[Obj], services: Sequence[Obj], classes: Sequence[Obj]) -> list[str]:
    """What a delete still has to wait for (names), [] when nothing of the spec is left."""
    out = [f"pod/{(p.get('metadata') or {}).get('name')}" for p in pods]
    out += [f"service/{(s.get('metadata') or {}).get('name')}" for s in services]
    out += [f"computeclass/{(c.get('metadata') or {}).get('name')}" for c in classes]
    return out


def smoke_problems(
    models: Obj, completion: Obj, served_model_name: str, checkpoint_uri: str, roots: Collection[str] = ()
) -> list[str]:
    """Why the Service's answers do not prove the export is served ([] when they do).

    vLLM's /v1/models names the served model and its `root` (the model argument it was started with: the
    export's gs:// URI with the streamer, the FUSE mount of that export otherwise: `roots`, from
    interlude.serving.loading.served_roots); the completion must come from the same served name and carry
    generated text.
    """
    problems: list[str] = []
    wanted = {r.rstrip("/") for r in roots} | {checkpoint_uri.rstrip("/")}
    served = {str(m.get("root", "")).rstrip("/") for m in models.get("data") or () if m.get("id") == served_model_name}
    if not served or not served <= wanted:
        expected = " or ".join(sorted(wanted))
        problems.append(f"/v1/models serves {sorted(served) or 'nothing'} as {served_model_name!r}, not {expected}")
    if completion.get("model") != served_model_name:
        problems.append(f"/v1/completions answered for model {completion.get('model')!r}, not {served_model_name!r}")
    choices = completion.get("choices") or ()
    if not choices or not str(choices[0].get("text", "")).strip():
        problems.append("/v1/completions returned no generated text")
    return problems
