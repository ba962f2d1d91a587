"""Cluster autoscaler + ComputeClass on the TPU/GPU guide's cluster, driven like a reconcile loop.

The small ``Cluster`` below plays the controllers: it applies the plan's actions (new nodes start not
ready and become ready on ``provision()``), binds pending pods with the scheduler, and replaces evicted
pods as a Deployment would. Assertions look at where pods ended up, not at the plan's wording.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from interlude_localcloud.gke.policy.autoscaler import (
    AutoscalerState,
    ClusterView,
    DefaultScaleUp,
    Migrate,
    NoScaleUp,
    PodScaleUpNote,
    ScaleDown,
    ScaleUp,
    ScaleUpFailed,
    class_rank,
    plan,
)
from interlude_localcloud.gke.policy.compute_class import ComputeClass
from interlude_localcloud.gke.policy.maintenance import MaintenanceNotice, maintenance_status
from interlude_localcloud.gke.policy.model import (
    CapacityEntry,
    Node,
    NodePool,
    PodView,
    ZoneCapacity,
)
from interlude_localcloud.gke.policy.scheduling import pick_node, usage_by_node

from .guide import CLASS, GPU_POOL, POOLS, TPU_POOL, ZONE, compute_class, vllm_pod

TPU_STOCKOUT = ZoneCapacity.of([CapacityEntry(ZONE, TPU_POOL.machine_type, 0, stockout=True)])


@dataclass
class Cluster:
    cls: ComputeClass
    pools: tuple[NodePool, ...] = POOLS
    capacity: ZoneCapacity = field(default_factory=ZoneCapacity)
    nodes: list[Node] = field(default_factory=list)
    pods: list[PodView] = field(default_factory=list)
    state: AutoscalerState = field(default_factory=AutoscalerState)
    now: float = 0.0
    made: int = 0
    log: list[object] = field(default_factory=list)
    tpu_wait: float = 0.0

    def view(self) -> ClusterView:
        return ClusterView(self.pools, tuple(self.nodes), tuple(self.pods), {CLASS: self.cls}, self.capacity)

    def scale(self, replicas: int) -> None:
        while len(self.pods) < replicas:
            self.made += 1
            self.pods.append(vllm_pod(f"vllm-{self.made}", created_at=self.now))
        del self.pods[replicas:]

    def autoscale(self) -> list[object]:
        result = plan(self.view(), self.state, self.now, tpu_fallback_wait=self.tpu_wait)
        self.state = result.state
        self.log.extend(result.actions)
        pools = {p.name: p for p in self.pools}
        for action in result.actions:
            if isinstance(action, ScaleUp):
                for _ in range(action.count):
                    index = sum(1 for n in self.nodes if n.pool == action.pool)
                    self.nodes.append(pools[action.pool].new_node(f"{action.pool}-{index}", self.now, ready=False))
            elif isinstance(action, Migrate):
                self.pods = [p for p in self.pods if p.name != action.pod]
                if action.cordon_source:
                    self.nodes = [
                        replace(n, unschedulable=True) if n.name == action.from_node else n for n in self.nodes
                    ]
                self.scale(len(self.pods) + 1)
            elif isinstance(action, ScaleDown):
                self.nodes = [n for n in self.nodes if n.name != action.node]
        return list(result.actions)

    def provision(self) -> None:
        self.nodes = [replace(n, ready=True) for n in self.nodes]

    def bind(self) -> None:
        for i, pod in enumerate(self.pods):
            if pod.node_name is None:
                rank = class_rank({CLASS: self.cls}, self.pools, pod)
                placement = pick_node(pod, self.nodes, usage_by_node(self.pods), rank)
                if placement.node is not None:
                    self.pods[i] = replace(pod, node_name=placement.node)

    def step(self, seconds: float = 15.0) -> list[object]:
        self.now += seconds
        actions = self.autoscale()
        self.provision()
        self.bind()
        return actions

    def placement(self) -> dict[str, int]:
        pools = {n.name: n.pool for n in self.nodes}
        counts: dict[str, int] = {}
        for pod in self.pods:
            key = pools[pod.node_name] if pod.node_name else "pending"
            counts[key] = counts.get(key, 0) + 1
        return counts


def test_one_replica_goes_to_tpu() -> None:
    cluster = Cluster(compute_class())
    cluster.scale(1)
    actions = cluster.step()
    assert [(a.pool, a.count) for a in actions if isinstance(a, ScaleUp)] == [("v6e-1", 1)]
    assert cluster.placement() == {"v6e-1": 1}


def test_three_replicas_one_tpu_two_l4() -> None:
    cluster = Cluster(compute_class())
    cluster.scale(3)
    actions = cluster.step()
    assert sorted((a.pool, a.count) for a in actions if isinstance(a, ScaleUp)) == [("l4", 2), ("v6e-1", 1)]
    assert cluster.placement() == {"v6e-1": 1, "l4": 2}
    assert cluster.step() == []  # settled: nothing more to do


def test_tpu_stockout_next_pod_goes_to_gpu_fast_and_pool_backs_off() -> None:
    cluster = Cluster(compute_class(), capacity=TPU_STOCKOUT)
    cluster.scale(1)
    actions = cluster.step()
    failed = [a for a in actions if isinstance(a, ScaleUpFailed)]
    assert [a.pool for a in failed] == ["v6e-1"] and "GCE_STOCKOUT" in failed[0].reason
    assert cluster.placement() == {"l4": 1}  # same pass, no waiting
    cluster.scale(2)
    actions = cluster.step()
    assert not [a for a in actions if isinstance(a, ScaleUpFailed)]  # backed off: not retried yet
    assert cluster.placement() == {"l4": 2}
    assert cluster.state.backoff_until["v6e-1"] == failed[0].retry_at == 15.0 + 300.0


def test_tpu_stockout_with_gkes_tpu_wait_keeps_pods_pending_until_the_wait_passes() -> None:
    """GKE's configurable TPU delay: no next priority while the TPU pool's failures are younger than the wait."""
    cluster = Cluster(compute_class(), capacity=TPU_STOCKOUT, tpu_wait=600.0)
    cluster.scale(1)
    actions = cluster.step()  # t=15: the TPU scale-up fails, the pod waits
    assert cluster.placement() == {"pending": 1}
    notes = [a for a in actions if isinstance(a, PodScaleUpNote)]
    assert [(n.pod, n.reason) for n in notes] == [("vllm-1", "FailedScaleUp")]
    assert "GCE out of resources" in notes[0].message
    assert cluster.state.stockout_since == {"v6e-1": 15.0}
    cluster.scale(2)
    actions = cluster.step(200.0)  # t=215: backed off, still inside the wait: both wait, told why
    assert cluster.placement() == {"pending": 2}
    waiting = {a.pod: a.message for a in actions if isinstance(a, PodScaleUpNote)}
    assert waiting == {p: "pod didn't trigger scale-up: 1 in backoff after failed scale-up" for p in waiting}
    assert set(waiting) == {"vllm-1", "vllm-2"}
    [stuck, _] = [a for a in actions if isinstance(a, NoScaleUp)]
    assert "waiting for TPU capacity in v6e-1 (200 of 600 s)" in stuck.reason
    cluster.step(400.0)  # t=615: the wait is over: the next priority (L4) takes them
    assert cluster.placement() == {"l4": 2}


def test_the_tpu_wait_ends_with_the_stockout() -> None:
    cluster = Cluster(compute_class(), capacity=TPU_STOCKOUT, tpu_wait=600.0)
    cluster.scale(1)
    cluster.step()
    cluster.capacity = ZoneCapacity()
    cluster.step(400.0)  # the backoff is over and TPU capacity is back: a TPU node, the streak ends
    assert cluster.placement() == {"v6e-1": 1} and cluster.state.stockout_since == {}


def test_capacity_back_with_active_migration_moves_pod_back_to_tpu() -> None:
    cluster = Cluster(compute_class(activeMigration={"optimizeRulePriority": True}), capacity=TPU_STOCKOUT)
    cluster.scale(1)
    cluster.step()
    assert cluster.placement() == {"l4": 1}
    cluster.capacity = ZoneCapacity()
    cluster.step(60)  # still backed off: nothing moves
    assert cluster.placement() == {"l4": 1}
    actions = cluster.step(300)  # backoff over: a TPU node is requested for the migration
    assert [(a.pool, a.count) for a in actions if isinstance(a, ScaleUp)] == [("v6e-1", 1)]
    assert "active migration" in next(a for a in actions if isinstance(a, ScaleUp)).reason
    assert not [a for a in actions if isinstance(a, Migrate)]  # the new node is not ready yet
    actions = cluster.step()  # the TPU node is ready: move the pod
    moves = [a for a in actions if isinstance(a, Migrate)]
    assert [(m.to_pool, m.to_priority, m.cordon_source) for m in moves] == [("v6e-1", 0, True)]
    assert cluster.placement() == {"v6e-1": 1}
    # the next pass sees l4-0 empty; the default consolidation delay (10 min) then runs from there
    assert [a.node for a in cluster.step(10) if isinstance(a, ScaleDown)] == []
    assert [a.node for a in cluster.step(599) if isinstance(a, ScaleDown)] == []
    assert [a.node for a in cluster.step(1) if isinstance(a, ScaleDown)] == ["l4-0"]


def test_without_active_migration_pods_stay_on_gpu() -> None:
    cluster = Cluster(compute_class(), capacity=TPU_STOCKOUT)
    cluster.scale(1)
    cluster.step()
    cluster.capacity = ZoneCapacity()
    for _ in range(3):
        assert not [a for a in cluster.step(400) if isinstance(a, ScaleUp | Migrate)]
    assert cluster.placement() == {"l4": 1}


def test_do_not_scale_up_leaves_pods_pending() -> None:
    full_gpu = ZoneCapacity.of(
        [
            CapacityEntry(ZONE, TPU_POOL.machine_type, stockout=True),
            CapacityEntry(ZONE, GPU_POOL.machine_type, available_nodes=1),
        ]
    )
    cluster = Cluster(compute_class(whenUnsatisfiable="DoNotScaleUp"), capacity=full_gpu)
    cluster.scale(2)
    actions = cluster.step()
    assert cluster.placement() == {"l4": 1, "pending": 1}
    [stuck] = [a for a in actions if isinstance(a, NoScaleUp)]
    assert "DoNotScaleUp" in stuck.reason and "GCE_STOCKOUT" in stuck.reason
    assert not [a for a in actions if isinstance(a, DefaultScaleUp)]


def test_scale_up_anyway_asks_for_a_default_node() -> None:
    cluster = Cluster(compute_class(whenUnsatisfiable="ScaleUpAnyway"), capacity=TPU_STOCKOUT)
    cluster.pools = (TPU_POOL, replace(GPU_POOL, max_nodes=1))
    cluster.scale(2)
    actions = cluster.step()
    [anyway] = [a for a in actions if isinstance(a, DefaultScaleUp)]
    assert anyway.compute_class == CLASS and "at its maximum of 1" in anyway.reason
    assert cluster.placement() == {"l4": 1, "pending": 1}


def test_pool_max_sizes_respected() -> None:
    cluster = Cluster(compute_class())
    cluster.scale(7)
    cluster.step()
    assert cluster.placement() == {"v6e-1": 1, "l4": 4, "pending": 2}


def test_limited_zone_capacity_counts_nodes_planned_in_the_same_pass() -> None:
    two_l4 = ZoneCapacity.of([CapacityEntry(ZONE, GPU_POOL.machine_type, available_nodes=2)])
    cluster = Cluster(compute_class(), capacity=two_l4)
    cluster.scale(4)
    actions = cluster.step()
    assert cluster.placement() == {"v6e-1": 1, "l4": 2, "pending": 1}
    assert [a.pool for a in actions if isinstance(a, ScaleUpFailed)] == ["l4"]


def test_consolidation_delay_from_the_class_and_pool_minimum() -> None:
    cluster = Cluster(compute_class(autoscalingPolicy={"consolidationDelayMinutes": 2}))
    cluster.pools = (TPU_POOL, replace(GPU_POOL, min_nodes=1))
    cluster.scale(3)
    cluster.step()
    cluster.scale(0)
    assert not [a for a in cluster.step(10) if isinstance(a, ScaleDown)]  # first seen empty
    assert not [a for a in cluster.step(119) if isinstance(a, ScaleDown)]
    downs = [a for a in cluster.step(1) if isinstance(a, ScaleDown)]
    assert sorted(a.node for a in downs) == ["l4-0", "v6e-1-0"]  # l4-1 stays: the pool's minimum is 1
    assert "consolidation delay of 2 min" in downs[0].reason
    assert [n.name for n in cluster.nodes] == ["l4-1"]


def test_node_that_gets_a_pod_again_restarts_its_empty_clock() -> None:
    cluster = Cluster(compute_class(autoscalingPolicy={"consolidationDelayMinutes": 2}))
    cluster.scale(1)
    cluster.step()
    cluster.scale(0)
    cluster.step(100)
    cluster.scale(1)
    cluster.step(10)
    cluster.scale(0)
    assert not [a for a in cluster.step(100) if isinstance(a, ScaleDown)]  # empty again: the clock restarts
    assert not [a for a in cluster.step(110) if isinstance(a, ScaleDown)]  # 110 s < 2 min, though 320 s in all
    assert [a.node for a in cluster.step(10) if isinstance(a, ScaleDown)] == ["v6e-1-0"]


def test_unknown_class_and_classless_pods() -> None:
    cluster = Cluster(compute_class())
    cluster.pods = [replace(vllm_pod("x"), node_selector={"cloud.google.com/compute-class": "missing"})]
    [stuck] = cluster.step()
    assert isinstance(stuck, NoScaleUp) and "does not exist" in stuck.reason
    plain = NodePool("default", ZONE, "e2-standard-4", {"cpu": 3.9, "memory": 14e9}, max_nodes=2)
    cluster = Cluster(compute_class(), pools=(*POOLS, plain))
    cluster.pods = [PodView("web", requests={"cpu": 1.0})]
    cluster.step()
    assert cluster.placement() == {"default": 1}


def test_three_replicas_after_stockout_one_moves_back_the_tpu_pool_max_is_one() -> None:
    cluster = Cluster(compute_class(activeMigration={"optimizeRulePriority": True}), capacity=TPU_STOCKOUT)
    cluster.scale(3)
    cluster.step()
    assert cluster.placement() == {"l4": 3}
    cluster.capacity = ZoneCapacity()
    for _ in range(8):
        cluster.step(300)
    assert cluster.placement() == {"v6e-1": 1, "l4": 2}
    assert len([a for a in cluster.log if isinstance(a, Migrate)]) == 1
    assert len([a for a in cluster.log if isinstance(a, ScaleDown)]) == 1  # the emptied L4 node
    assert sorted(n.pool for n in cluster.nodes) == ["l4", "l4", "v6e-1"]


def test_tpu_node_under_maintenance_sends_the_replacement_pod_to_l4() -> None:
    """The TPU pool's only node is tainted for maintenance: its evicted pod's replacement goes to L4."""
    cluster = Cluster(compute_class())
    cluster.scale(1)
    cluster.step()
    assert cluster.placement() == {"v6e-1": 1}
    notice = MaintenanceNotice(notice_at=cluster.now, window_start=cluster.now + 30)
    cluster.now += 30
    tpu = next(n for n in cluster.nodes if n.pool == "v6e-1")
    status = maintenance_status(tpu, notice, cluster.now)
    assert status.evict_pods
    cluster.nodes = [replace(n, labels=status.labels, taints=status.taints) if n is tpu else n for n in cluster.nodes]
    cluster.pods = [p for p in cluster.pods if p.node_name != tpu.name]
    cluster.scale(1)
    actions = cluster.step()
    assert [(a.pool, a.count) for a in actions if isinstance(a, ScaleUp)] == [("l4", 1)]  # TPU pool is at max 1
    assert cluster.placement() == {"l4": 1}


def test_a_long_not_ready_node_is_not_upcoming_capacity() -> None:
    cluster = Cluster(compute_class())
    cluster.nodes = [GPU_POOL.new_node("l4-0", created_at=0.0, ready=False)]
    cluster.scale(1)
    cluster.now = 100.0
    assert plan(cluster.view(), now=cluster.now).of(ScaleUp) == []  # 100 s old: still coming up
    cluster.now = 1000.0
    assert [(a.pool, a.count) for a in plan(cluster.view(), now=cluster.now).of(ScaleUp)] == [("v6e-1", 1)]


def test_migration_does_not_cordon_a_node_the_pool_minimum_keeps() -> None:
    cluster = Cluster(compute_class(activeMigration={"optimizeRulePriority": True}), capacity=TPU_STOCKOUT)
    cluster.pools = (TPU_POOL, replace(GPU_POOL, min_nodes=1))
    cluster.scale(1)
    cluster.step()
    cluster.capacity = ZoneCapacity()
    for _ in range(3):
        cluster.step(300)
    [move] = [a for a in cluster.log if isinstance(a, Migrate)]
    assert move.cordon_source is False
    assert cluster.placement() == {"v6e-1": 1}
    assert [n.name for n in cluster.nodes if n.pool == "l4"] == ["l4-0"]  # kept for min_nodes, not cordoned
    assert not any(n.unschedulable for n in cluster.nodes)
