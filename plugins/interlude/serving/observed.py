"""What the serving report counts, from the cluster's own records: every change of the serving pods (the
Kubernetes watch) and every request the replicas answered (their access logs), per accelerator.

Why the watch and not samples: a poll sees the pods at one moment and misses what came and went between two
polls; a watch from a resourceVersion delivers every change after it, in order
(https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes). When the API
no longer holds that version (410 Gone) the changes in between are lost, and the report says so.

Why the access logs, read while the pod lives: a response does not name the replica that answered, its pod's
log does (one uvicorn access line per request, see `interlude.serving.loadgen`), and a pod's log goes with the
pod. A `follow` stream opened while the pod lives delivers its lines until the container ends; a pod whose log
nobody read before it went is named in the report as not counted, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from interlude.serving.observe import epoch
from interlude.serving.policy import PodObs
from interlude.serving.report import PodCountSample, count_pods

Obj = Mapping[str, object]


@dataclass(frozen=True)
class PodChange:
    """One serving pod as a watch event left it (phase "Deleted" once the API no longer has it)."""

    rv: int  # the pod's resourceVersion at this change: the watch's order
    at: float  # epoch seconds: the pod's own newest stamp, or when the watch received the change
    name: str
    node: str | None
    phase: str
    ready: bool

    def key(self) -> tuple[str | None, str, bool]:
        return self.node, self.phase, self.ready

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)

    @staticmethod
    def from_dict(raw: Mapping[str, object]) -> PodChange:
        node = raw.get("node")
        return PodChange(
            int(str(raw["rv"])),
            float(str(raw["at"])),
            str(raw["name"]),
            None if node is None else str(node),
            str(raw["phase"]),
            bool(raw["ready"]),
        )


def _stamps(pod: Mapping[str, object]) -> list[float]:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    assert isinstance(meta, Mapping) and isinstance(status, Mapping)
    raw = [meta.get("creationTimestamp"), meta.get("deletionTimestamp"), status.get("startTime")]
    raw += [c.get("lastTransitionTime") for c in status.get("conditions") or () if isinstance(c, Mapping)]
    return [t for t in (epoch(str(s)) if s else None for s in raw) if t is not None]


def pod_change(event_type: str, pod: Mapping[str, object], received: float) -> PodChange:
    """A watch event (ADDED/MODIFIED/DELETED and the pod as sent) -> PodChange.

    `at` is the pod's own newest stamp (creation, start, a condition's transition, deletion) when it has one
    not after `received`, else `received`: so changes replayed from the watch history keep their own time.
    A DELETED event without a deletionTimestamp is timed when it was received."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    assert isinstance(meta, Mapping) and isinstance(spec, Mapping) and isinstance(status, Mapping)
    if event_type == "DELETED":
        phase = "Deleted"
    else:
        phase = "Terminating" if meta.get("deletionTimestamp") else str(status.get("phase") or "Pending")
    ready = any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    stamps = [t for t in _stamps(pod) if t <= received]
    deleted_unstamped = event_type == "DELETED" and not meta.get("deletionTimestamp")
    at = received if deleted_unstamped or not stamps else max(stamps)
    node = spec.get("nodeName")
    return PodChange(
        int(str(meta.get("resourceVersion") or 0)),
        at,
        str(meta.get("name")),
        str(node) if node else None,
        phase,
        ready and phase != "Deleted",
    )


def _counts(state: Mapping[str, PodChange], kinds: Mapping[str, str | None], at: float, rv: int) -> PodCountSample:
    pods = [PodObs(c.name, c.phase, c.ready, c.node, kinds.get(c.node or "")) for c in state.values()]
    sample = count_pods(pods, at)
    return PodCountSample(at, sample.counts, rv)


def timeline(
    started_at: float,
    initial: Iterable[PodChange],
    changes: Iterable[PodChange],
    node_kinds: Mapping[str, str | None],
) -> tuple[PodCountSample, ...]:
    """Pods per accelerator after every change that altered the counts, from the pods at `started_at` on.

    Changes are applied in resourceVersion order (a change seen twice, e.g. replayed after a resumed watch,
    counts once)."""
    state = {c.name: c for c in initial}
    samples = [_counts(state, node_kinds, started_at, max((c.rv for c in state.values()), default=0))]
    for change in sorted({c.rv: c for c in changes}.values(), key=lambda c: c.rv):
        if change.phase == "Deleted":
            state.pop(change.name, None)
        else:
            state[change.name] = change
        sample = _counts(state, node_kinds, change.at, change.rv)
        if sample.counts != samples[-1].counts:
            samples.append(sample)
    return tuple(samples)


def nodes_of(changes: Iterable[PodChange]) -> dict[str, str]:
    """pod -> the node it was bound to (a pod is never moved: the last node named is its node)."""
    return {c.name: c.node for c in changes if c.node}


def ran(changes: Iterable[PodChange]) -> set[str]:
    """The pods whose containers ran at some point (Running in some change): the ones that may have answered."""
    return {c.name for c in changes if c.phase == "Running"}


@dataclass(frozen=True)
class Served:
    """One pod's access log as read: requests answered 2xx and otherwise."""

    ok: int
    failed: int

    def minus(self, before: Served) -> Served:
        return Served(max(0, self.ok - before.ok), max(0, self.failed - before.failed))


def requests_per_accelerator(
    served: Mapping[str, Served],
    baseline: Mapping[str, Served],
    pod_nodes: Mapping[str, str],
    node_kinds: Mapping[str, str | None],
) -> dict[str, Served]:
    """Requests answered per accelerator since the run began: each pod's log count minus what its log held
    before the run (`baseline`: pods that were already there), by its node's accelerator ("unknown" without)."""
    out: dict[str, Served] = {}
    for pod, count in served.items():
        since = count.minus(baseline.get(pod, Served(0, 0)))
        kind = node_kinds.get(pod_nodes.get(pod, "")) or "unknown"
        total = out.get(kind, Served(0, 0))
        out[kind] = Served(total.ok + since.ok, total.failed + since.failed)
    return out


def uncounted(ran_pods: Iterable[str], read: Iterable[str]) -> list[str]:
    """Pods that ran but whose log nobody read before they went: their requests are not in the counts."""
    return sorted(set(ran_pods) - set(read))


def unknown_nodes(changes: Sequence[PodChange], node_kinds: Mapping[str, str | None]) -> set[str]:
    """Nodes named by the pods whose accelerator is not known yet (to be read from the API)."""
    return {c.node for c in changes if c.node and c.node not in node_kinds}
