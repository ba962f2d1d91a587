"""Cluster autoscaler with custom ComputeClass semantics, as one pure planning pass.

What it models (https://cloud.google.com/kubernetes-engine/docs/concepts/about-custom-compute-classes,
https://cloud.google.com/kubernetes-engine/docs/concepts/cluster-autoscaler):

- Scale-up: pods the scheduler cannot place on existing (or upcoming: requested less than 15 minutes ago,
  not yet ready) nodes make
  the autoscaler walk their ComputeClass ``priorities`` in order and add a node to the first pool that
  would fit the pod, is below its ``max_nodes`` and has zone capacity. A stockout fails that pool's
  scale-up (as GCE_STOCKOUT / ZONE_RESOURCE_POOL_EXHAUSTED do), backs the pool off, and the autoscaler
  moves to the next priority in the same pass: GKE's ComputeClass troubleshooting page says it moves on
  without waiting, "except when using TPUs or the Flex Start provisioning model, which support a
  configurable delay" (https://cloud.google.com/kubernetes-engine/docs/troubleshooting/custom-computeclass).
  ``tpu_fallback_wait`` models that delay: while a TPU pool's capacity failures are younger than it, pods
  wanting it stay pending instead of moving on (the vLLM TPU/GPU recipe reports up to 10 hours). Each pod
  a stockout failed gets a ``PodScaleUpNote`` (the cluster autoscaler's pod events ``FailedScaleUp`` /
  ``NotTriggerScaleUp``, https://cloud.google.com/kubernetes-engine/docs/how-to/cluster-autoscaler-visibility).
- ``whenUnsatisfiable``: ``DoNotScaleUp`` leaves the pods pending; ``ScaleUpAnyway`` asks for a node of
  the default machine series (GKE's fallback; the caller decides what that means locally).
- ``activeMigration.optimizeRulePriority``: pods running on a lower priority move back when a higher one
  has room again - first a node is requested there, then (once it is ready) the pods are migrated.
- Scale-down: a node with no pods that stayed empty for ``consolidationDelayMinutes`` (default: the
  autoscaler's 10 minutes) is removed, never below the pool's ``min_nodes``.

Every action carries a human reason. State that spans passes (backoffs, since-when a node is empty) goes
in and comes out as :class:`AutoscalerState`; ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from interlude_localcloud.gke.policy.compute_class import ComputeClass
from interlude_localcloud.gke.policy.model import (
    DEFAULT_CONSOLIDATION_DELAY_MINUTES,
    Node,
    NodePool,
    PodView,
    ZoneCapacity,
)
from interlude_localcloud.gke.policy.scheduling import NodeRank, add_usage, check, insufficient, usage_by_node

DEFAULT_BACKOFF_SECONDS = 300.0  # the cluster autoscaler's initial node-group backoff
MAX_NODE_PROVISION_SECONDS = 900.0  # --max-node-provision-time: a not-ready node younger than this is upcoming


@dataclass(frozen=True)
class ScaleUp:
    pool: str
    count: int
    reason: str


@dataclass(frozen=True)
class ScaleUpFailed:
    pool: str
    reason: str
    retry_at: float


@dataclass(frozen=True)
class NoScaleUp:
    pod: str
    reason: str


@dataclass(frozen=True)
class DefaultScaleUp:
    """whenUnsatisfiable: ScaleUpAnyway - a node of the default machine series for this pod."""

    pod: str
    compute_class: str
    reason: str


@dataclass(frozen=True)
class Migrate:
    pod: str
    from_node: str
    to_pool: str
    to_priority: int
    reason: str
    cordon_source: bool = False  # every pod of the node moves and it can go: keep new pods off it


@dataclass(frozen=True)
class ScaleDown:
    node: str
    reason: str


@dataclass(frozen=True)
class PodScaleUpNote:
    """A Kubernetes Event the cluster autoscaler puts on a pod (reason FailedScaleUp / NotTriggerScaleUp)."""

    pod: str
    reason: str
    message: str


Action = ScaleUp | ScaleUpFailed | NoScaleUp | DefaultScaleUp | Migrate | ScaleDown | PodScaleUpNote


@dataclass(frozen=True)
class ClusterView:
    pools: Sequence[NodePool]
    nodes: Sequence[Node]
    pods: Sequence[PodView]
    classes: Mapping[str, ComputeClass] = field(default_factory=dict)
    capacity: ZoneCapacity = field(default_factory=ZoneCapacity)


@dataclass(frozen=True)
class AutoscalerState:
    backoff_until: Mapping[str, float] = field(default_factory=dict)  # pool -> time its backoff ends
    empty_since: Mapping[str, float] = field(default_factory=dict)  # node -> first pass it was empty
    stockout_since: Mapping[str, float] = field(default_factory=dict)  # pool -> first failed scale-up of a streak


@dataclass(frozen=True)
class Plan:
    actions: tuple[Action, ...]
    state: AutoscalerState

    def of(self, kind: type) -> list[Action]:
        return [a for a in self.actions if isinstance(a, kind)]


@dataclass
class _Room:
    """A node the pass may put pods on: existing, upcoming (not ready yet) or planned in this pass."""

    node: Node
    used: dict[str, float]
    ready: bool


class _Pass:
    """Bookkeeping of one planning pass (mutable on purpose; never escapes :func:`plan`)."""

    def __init__(
        self, view: ClusterView, state: AutoscalerState, now: float, backoff_seconds: float, tpu_wait: float = 0.0
    ) -> None:
        self.view = view
        self.now = now
        self.backoff_seconds = backoff_seconds
        self.tpu_wait = tpu_wait
        self.stockout_since = dict(state.stockout_since)
        self.pools = {p.name: p for p in view.pools}
        self.backoff = {k: v for k, v in state.backoff_until.items() if v > now}
        self.planned: dict[str, int] = {}
        self.failed_pools: set[str] = set()
        self.actions: list[Action] = []
        self.reasons: dict[str, list[str]] = {}
        self.templates: dict[str, Node] = {}
        used = usage_by_node(view.pods)
        self.rooms = [
            _Room(n, dict(used.get(n.name, {})), n.ready)
            for n in view.nodes
            if not (n.unschedulable or n.draining)
            and (n.ready or now - n.created_at <= MAX_NODE_PROVISION_SECONDS)  # an old NotReady node is broken
        ]

    def template(self, pool: NodePool) -> Node:
        """What a new node of the pool would look like (built once per pass)."""
        if pool.name not in self.templates:
            self.templates[pool.name] = pool.new_node(f"{pool.name}-template")
        return self.templates[pool.name]

    def pool_size(self, pool: NodePool) -> int:
        return sum(1 for n in self.view.nodes if n.pool == pool.name) + self.planned.get(pool.name, 0)

    def planned_in(self, zone: str, machine_type: str) -> int:
        return sum(
            n
            for name, n in self.planned.items()
            if (p := self.pools[name]).zone == zone and p.machine_type == machine_type
        )

    def why_not(self, pool: NodePool, pod: PodView) -> str | None:
        """None when one more node of ``pool`` can be requested for ``pod``; else why not (and back off)."""
        if not check(pod, self.template(pool), {}).fits:
            return f"a {pool.name} node would not fit it"
        if pool.name in self.backoff:
            return f"pool {pool.name} is backed off until {self.backoff[pool.name]:.0f} after a failed scale-up"
        if self.pool_size(pool) >= pool.max_nodes:
            return f"pool {pool.name} is at its maximum of {pool.max_nodes} node(s)"
        entry = self.view.capacity.lookup(pool.zone, pool.machine_type)
        exhausted = (
            entry.available_nodes is not None
            and entry.available_nodes - self.planned_in(pool.zone, pool.machine_type) <= 0
        )
        if entry.stockout or exhausted:
            self.fail(pool)
            self.actions.append(
                PodScaleUpNote(
                    pod.name,
                    "FailedScaleUp",
                    f"Node scale up in zones {pool.zone} associated with this pod failed: GCE out of resources. "
                    "Pod is at risk of not being scheduled.",
                )
            )
            return f"pool {pool.name}: GCE_STOCKOUT in {pool.zone}"
        return None

    def waits_for_tpu(self, pool: NodePool) -> bool:
        """GKE's TPU delay: capacity failures of this TPU pool are younger than the wait, so no next priority."""
        since = self.stockout_since.get(pool.name)
        return pool.tpu is not None and since is not None and self.now - since < self.tpu_wait

    def fail(self, pool: NodePool) -> None:
        self.stockout_since.setdefault(pool.name, self.now)
        retry_at = self.now + self.backoff_seconds
        self.backoff[pool.name] = retry_at
        if pool.name not in self.failed_pools:
            self.failed_pools.add(pool.name)
            self.actions.append(
                ScaleUpFailed(
                    pool.name,
                    f"GCE_STOCKOUT: zone {pool.zone} has no {pool.machine_type} capacity "
                    f"(ZONE_RESOURCE_POOL_EXHAUSTED); backing off until {retry_at:.0f}, trying the next priority",
                    retry_at,
                )
            )

    def add_node(self, pool: NodePool, pod: PodView, why: str) -> _Room:
        self.stockout_since.pop(pool.name, None)  # capacity again: the streak ends
        self.planned[pool.name] = self.planned.get(pool.name, 0) + 1
        room = _Room(pool.new_node(f"{pool.name}-planned-{self.planned[pool.name]}", self.now, ready=False), {}, False)
        self.rooms.append(room)
        self.reasons.setdefault(pool.name, []).append(f"{pod.name}: {why}")
        return room

    def fit_room(self, pod: PodView, ladder: Sequence[tuple[int, NodePool]]) -> _Room | None:
        """The room this pod would take: best priority first, ready before upcoming, then by name."""
        order = {pool.name: index for index, pool in ladder}
        rooms = [r for r in self.rooms if r.node.pool in order and not insufficient(pod, r.node, r.used)]
        for room in sorted(rooms, key=lambda r: (order[r.node.pool], not r.ready, r.node.name)):
            if check(pod, room.node, room.used, assume_ready=True).fits:
                return room
        return None


def _take(room: _Room, pod: PodView) -> None:
    add_usage(room.used, pod)


def _ladder(view: ClusterView, cls: ComputeClass | None) -> list[tuple[int, NodePool]]:
    """(priority index, pool) in the order the autoscaler tries them; classless pods use classless pools."""
    if cls is None:
        return [(0, p) for p in sorted(view.pools, key=lambda p: p.name) if p.compute_class is None]
    ranked = [(r, p) for p in view.pools if (r := cls.rank(p)) is not None]
    return sorted(ranked, key=lambda rp: (rp[0], rp[1].name))


def _scale_up_one(run: _Pass, pod: PodView) -> None:
    cls = run.view.classes.get(pod.compute_class) if pod.compute_class else None
    ladder = _ladder(run.view, cls)
    room = run.fit_room(pod, ladder)
    if room is not None:  # an existing, upcoming or already requested node takes it
        _take(room, pod)
        return
    notes = []
    for index, pool in ladder:
        reason = run.why_not(pool, pod)
        if reason is None:
            rule = cls.priorities[index].describe() if cls else "no ComputeClass"
            _take(run.add_node(pool, pod, f"priority {index} ({rule})"), pod)
            return
        notes.append(reason)
        if run.waits_for_tpu(pool):
            since = run.stockout_since[pool.name]
            notes.append(
                f"waiting for TPU capacity in {pool.name} ({run.now - since:.0f} of {run.tpu_wait:.0f} s) before "
                "the next priority"
            )
            break
    _unsatisfiable(run, pod, cls, notes)


def _unsatisfiable(run: _Pass, pod: PodView, cls: ComputeClass | None, notes: list[str]) -> None:
    if pod.compute_class and cls is None:
        run.actions.append(NoScaleUp(pod.name, f"ComputeClass {pod.compute_class} does not exist"))
        return
    detail = "; ".join(notes) or "no node pool matches"
    if cls is not None and cls.when_unsatisfiable == "ScaleUpAnyway":
        run.actions.append(
            DefaultScaleUp(pod.name, cls.name, f"no priority of {cls.name} can be satisfied ({detail}); ScaleUpAnyway")
        )
        return
    policy = f"{cls.name} says DoNotScaleUp" if cls is not None else "no autoscaled pool fits"
    run.actions.append(NoScaleUp(pod.name, f"pod stays pending: {detail}; {policy}"))
    backed_off = sum(1 for note in notes if "after a failed scale-up" in note)
    if backed_off:  # the cluster autoscaler's wording, which tools match on
        run.actions.append(
            PodScaleUpNote(
                pod.name,
                "NotTriggerScaleUp",
                f"pod didn't trigger scale-up: {backed_off} in backoff after failed scale-up",
            )
        )


def _scale_up_actions(run: _Pass) -> list[ScaleUp]:
    return [
        ScaleUp(name, count, f"{count} node(s) for unschedulable pods - " + "; ".join(run.reasons[name]))
        for name, count in sorted(run.planned.items())
    ]


def _migrations(run: _Pass) -> None:
    """Active migration: pods of an optimizeRulePriority class on a lower priority than one with room."""
    pools = run.pools
    node_pool = {n.name: n.pool for n in run.view.nodes if n.ready}
    candidates = []
    for pod in run.view.pods:
        cls = run.view.classes.get(pod.compute_class or "")
        if cls is None or not cls.optimize_rule_priority or pod.node_name not in node_pool:
            continue
        current = cls.rank(pools[node_pool[pod.node_name]]) if node_pool[pod.node_name] in pools else None
        if current:
            candidates.append((-current, pod.name, pod, cls, current))
    moving: dict[str, list[str]] = {}
    migrations: list[Migrate] = []
    for _, _, pod, cls, current in sorted(candidates, key=lambda c: (c[0], c[1])):
        action = _migrate_one(run, pod, cls, current)
        if action is not None:
            migrations.append(action)
            moving.setdefault(action.from_node, []).append(pod.name)
    on_node: dict[str, int] = {}
    for pod in run.view.pods:
        if pod.node_name:
            on_node[pod.node_name] = on_node.get(pod.node_name, 0) + 1
    removable = {n.name for n in run.view.nodes if (p := pools.get(n.pool)) and run.pool_size(p) > p.min_nodes}
    # cordon only a node that empties and may then be scaled down; a node kept for min_nodes stays open
    run.actions.extend(
        replace(m, cordon_source=len(moving[m.from_node]) == on_node[m.from_node] and m.from_node in removable)
        for m in migrations
    )


def _migrate_one(run: _Pass, pod: PodView, cls: ComputeClass, current: int) -> Migrate | None:
    for index, pool in _ladder(run.view, cls):
        if index >= current:
            return None
        room = run.fit_room(pod, [(index, pool)])
        if room is None and run.why_not(pool, pod) is None:
            room = run.add_node(pool, pod, f"active migration back to priority {index} of {cls.name}")
        if room is None:
            continue
        _take(room, pod)
        if not room.ready:
            return None  # wait for the new node to be ready before moving the pod
        return Migrate(
            pod.name,
            str(pod.node_name),
            pool.name,
            index,
            f"activeMigration: priority {index} ({cls.priorities[index].describe()}) of {cls.name} has room on "
            f"{room.node.name}; moving from priority {current}",
        )
    return None


def _scale_downs(run: _Pass, state: AutoscalerState, default_delay_minutes: int) -> dict[str, float]:
    busy = {p.node_name for p in run.view.pods if p.node_name}
    busy |= {r.node.name for r in run.rooms if r.used}  # pending pods or migrations were packed onto it
    empty_since: dict[str, float] = {}
    removed: dict[str, int] = {}
    for node in sorted(run.view.nodes, key=lambda n: n.name):
        pool = run.pools.get(node.pool)
        if node.name in busy or not node.ready or pool is None:
            continue
        since = state.empty_since.get(node.name, run.now)
        empty_since[node.name] = since
        cls = run.view.classes.get(pool.compute_class or "")
        minutes = cls.consolidation_delay_minutes if cls and cls.consolidation_delay_minutes else default_delay_minutes
        size = run.pool_size(pool) - removed.get(pool.name, 0)
        if run.now - since >= minutes * 60 and size > pool.min_nodes:
            removed[pool.name] = removed.get(pool.name, 0) + 1
            run.actions.append(
                ScaleDown(node.name, f"empty for {run.now - since:.0f}s >= consolidation delay of {minutes} min")
            )
    return empty_since


def plan(
    view: ClusterView,
    state: AutoscalerState | None = None,
    now: float = 0.0,
    backoff_seconds: float = DEFAULT_BACKOFF_SECONDS,
    default_consolidation_delay_minutes: int = DEFAULT_CONSOLIDATION_DELAY_MINUTES,
    tpu_fallback_wait: float = 0.0,
) -> Plan:
    """One autoscaler pass: scale-ups (with failures and fallbacks), migrations, scale-downs."""
    state = state or AutoscalerState()
    run = _Pass(view, state, now, backoff_seconds, tpu_fallback_wait)
    pending = sorted((p for p in view.pods if p.node_name is None), key=lambda p: (p.created_at, p.name))
    for pod in pending:  # each pending pod takes room where the scheduler would put it, else asks for a node
        _scale_up_one(run, pod)
    _migrations(run)
    scale_ups = _scale_up_actions(run)
    empty_since = _scale_downs(run, state, default_consolidation_delay_minutes)
    return Plan(
        tuple(scale_ups) + tuple(run.actions), AutoscalerState(dict(run.backoff), empty_since, run.stockout_since)
    )


def class_rank(classes: Mapping[str, ComputeClass], pools: Sequence[NodePool], pod: PodView) -> NodeRank:
    """For :func:`scheduling.pick_node`: a node's rank is its pool's priority in the pod's class."""
    cls = classes.get(pod.compute_class or "")
    by_name = {p.name: p for p in pools}

    def rank(node: Node) -> int:
        pool = by_name.get(node.pool)
        found = cls.rank(pool) if cls is not None and pool is not None else None
        return found if found is not None else len(cls.priorities) if cls is not None else 0

    return rank
