"""Stockout fallback and maintenance-aware serving: table-driven over every branch, with reasons."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from interlude.serving.policy import (
    LABEL_ACTIVE,
    LABEL_PERFORM,
    LABEL_SCHEDULED,
    EventObs,
    NodeObs,
    PodObs,
    ServingObservation,
    Step,
    fallback_decision,
    in_flight,
    is_stockout,
    maintenance_plan,
)
from interlude.serving.spec import ServeSpec

SPEC = ServeSpec(
    checkpoint_uri="gs://b-1/c/",
    fallback_after_seconds=300,
    tpu_retry_seconds=900,
    quiet_waiting_requests=0.5,
    maintenance_margin_seconds=600,
)
NOW = 10_000.0
STOCKOUT = "Node scale up in zones us-central2-b associated with this pod failed: GCE out of resources (GCE_STOCKOUT)"


def _pending(name: str, since: float | None) -> PodObs:
    return PodObs(name, "Pending", unschedulable_since=since, created_at=(since or NOW) - 1)


def _running(name: str, node: str, accelerator: str = "tpu", ready: bool = True) -> PodObs:
    return PodObs(name, "Running", ready=ready, node=node, accelerator=accelerator)


@pytest.mark.parametrize(
    ("reason", "message", "expected"),
    [
        ("FailedScaleUp", STOCKOUT, True),
        ("FailedScaleUp", "ZONE_RESOURCE_POOL_EXHAUSTED", True),
        ("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 in backoff after failed scale-up", True),
        ("FailedScaleUp", "Quota 'TPUS_PER_TPU_FAMILY' exceeded", False),
        ("NotTriggerScaleUp", "pod didn't trigger scale-up: 2 node(s) didn't match node selector", False),
        ("TriggeredScaleUp", "pod triggered scale-up (GCE_STOCKOUT in message by accident)", False),
        ("FailedScheduling", "0/3 nodes are available: GCE_STOCKOUT", False),
    ],
)
def test_stockout_evidence(reason: str, message: str, expected: bool) -> None:
    assert is_stockout(EventObs(reason, message, "p", NOW)) is expected


# -- TPU-first: when to fall back ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pods", "events", "action", "why"),
    [
        ((), (), "none", "no pod is waiting for capacity"),
        ((_running("a", "n1"),), (), "none", "no pod is waiting"),
        ((_pending("p", NOW - 3600),), (), "none", "without stockout evidence"),
        (
            (_pending("p", NOW - 3600),),
            (EventObs("FailedScaleUp", STOCKOUT, "other-pod", NOW),),
            "none",
            "without stockout evidence",
        ),
        (
            (_pending("p", NOW - 100),),
            (EventObs("FailedScaleUp", STOCKOUT, "p", NOW - 50),),
            "none",
            "for 100 s; falling back to GPU at 300 s",
        ),
        ((_pending("p", NOW - 299),), (EventObs("FailedScaleUp", STOCKOUT, "p", NOW),), "none", "falling back"),
        (
            (_pending("p", NOW - 300),),
            (EventObs("FailedScaleUp", STOCKOUT, "p", NOW),),
            "fall_back_to_gpu",
            "(>= 300 s): new replicas go to nvidia-l4; running TPU replicas stay",
        ),
        (
            (_running("a", "n1"), _pending("p", NOW - 4000), _pending("q", NOW - 10)),
            (
                EventObs("FailedScaleUp", STOCKOUT, "p", NOW - 3000),
                EventObs("NotTriggerScaleUp", "in backoff after failed scale-up", "q", NOW),
            ),
            "fall_back_to_gpu",
            "2 pod(s) pending on a TPU stockout for 4000 s",
        ),
        (
            (_pending("p", None),),
            (EventObs("FailedScaleUp", STOCKOUT, "p", NOW),),
            "none",
            "without stockout evidence",
        ),  # not (yet) unschedulable
    ],
)
def test_tpu_first(pods: tuple[PodObs, ...], events: tuple[EventObs, ...], action: str, why: str) -> None:
    plan = fallback_decision(ServingObservation(pods, events, "tpu_first", 0.0), NOW, SPEC)
    assert plan.action == action and why in plan.reason
    assert plan.order == ("gpu_first" if action == "fall_back_to_gpu" else "tpu_first")


def test_the_stuck_pods_are_named() -> None:
    obs = ServingObservation(
        (_pending("b", NOW - 400), _pending("a", NOW - 400)),
        (EventObs("FailedScaleUp", STOCKOUT, "a", NOW), EventObs("FailedScaleUp", STOCKOUT, "b", NOW)),
    )
    assert fallback_decision(obs, NOW, SPEC).stuck_pods == ("a", "b")


# -- GPU-first: when to move back ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("since", "events", "probe", "action", "why"),
    [
        (NOW - 10, (), True, "return_to_tpu", "capacity probe reports TPU capacity again"),
        (NOW - 5000, (), False, "none", "reports no TPU capacity"),
        (NOW - 100, (), None, "none", "GPU-first for 100 s; retrying TPU at 900 s"),
        (NOW - 899, (), None, "none", "retrying TPU at 900 s"),
        (NOW - 900, (), None, "return_to_tpu", "with no stockout since"),
        (
            NOW - 2000,
            (EventObs("FailedScaleUp", STOCKOUT, "p", NOW - 100),),
            None,
            "none",
            "1 stockout event(s) in the last 900 s",
        ),
        (NOW - 2000, (EventObs("FailedScaleUp", STOCKOUT, "p", NOW - 901),), None, "return_to_tpu", "no stockout"),
        (NOW - 2000, (EventObs("FailedScaleUp", "quota exceeded", "p", NOW - 1),), None, "return_to_tpu", ""),
    ],
)
def test_gpu_first(since: float, events: tuple[EventObs, ...], probe: bool | None, action: str, why: str) -> None:
    obs = ServingObservation((_running("g", "l4-1", "gpu"),), events, "gpu_first", since, probe)
    plan = fallback_decision(obs, NOW, SPEC)
    assert plan.action == action and why in plan.reason
    assert plan.order == ("tpu_first" if action == "return_to_tpu" else "gpu_first")


@pytest.mark.parametrize(
    ("order", "probe", "age", "stockout"),
    list(itertools.product(("tpu_first", "gpu_first"), (None, True, False), (0, 299, 300, 5000), (False, True))),
)
def test_every_decision_has_a_reason_and_a_consistent_order(
    order: str, probe: bool | None, age: float, stockout: bool
) -> None:
    events = (EventObs("FailedScaleUp", STOCKOUT, "p", NOW - 1),) if stockout else ()
    obs = ServingObservation((_pending("p", NOW - age),), events, order, NOW - age, probe)
    plan = fallback_decision(obs, NOW, SPEC)
    assert plan.reason
    expected_order = {"none": order, "fall_back_to_gpu": "gpu_first", "return_to_tpu": "tpu_first"}[plan.action]
    assert plan.order == expected_order
    assert not (order == "tpu_first" and plan.action == "return_to_tpu")
    assert not (order == "gpu_first" and plan.action == "fall_back_to_gpu")


# -- maintenance ------------------------------------------------------------------------------------------
def _node(name: str, at: float | None = None, cordoned: bool = False, **labels: str) -> NodeObs:
    all_labels = dict(labels)
    if at is not None:
        all_labels[LABEL_SCHEDULED] = str(int(at))
    return NodeObs(name, "tpu", cordoned=cordoned, labels=all_labels)


def _kinds(steps: list[Step]) -> list[tuple[str, str, int]]:
    return [(s.kind, s.node, s.count) for s in steps]


AT = NOW + 3600
PODS = (_running("a", "n1"), _running("b", "n2"))


@pytest.mark.parametrize(
    ("nodes", "pods", "desired", "waiting", "surged", "now", "expected", "why"),
    [
        # nothing scheduled
        ((_node("n1"), _node("n2")), PODS, 2, 0.0, {}, NOW, [], ""),
        # a bad label value is ignored, not a crash
        ((NodeObs("n1", labels={LABEL_SCHEDULED: "soon"}),), PODS, 2, 0.0, {}, NOW, [], ""),
        # 1. notice: cordon and surge one replacement
        (
            (_node("n1", AT), _node("n2")),
            PODS,
            2,
            0.0,
            {},
            NOW,
            [("cordon", "n1", 0), ("surge", "n1", 1)],
            "no new replica here",
        ),
        # cordoned by someone else, not surged yet: surge only
        ((_node("n1", AT, cordoned=True),), PODS, 2, 0.0, {}, NOW, [("surge", "n1", 1)], "replacement"),
        # 2. surged, replacement not Ready yet: wait
        (
            (_node("n1", AT, cordoned=True),),
            PODS + (_pending("c", NOW - 5),),
            3,
            0.0,
            {"n1": 1},
            NOW,
            [("wait", "n1", 0)],
            "1/2 replicas Ready off n1",
        ),
        # 3. replacement Ready but busy: wait for a quiet moment
        (
            (_node("n1", AT, cordoned=True),),
            PODS + (_running("c", "n3"),),
            3,
            3.0,
            {"n1": 1},
            NOW,
            [("wait", "n1", 0)],
            "waiting for a quiet moment",
        ),
        # 4. Ready and quiet: drain and trigger maintenance now
        (
            (_node("n1", AT, cordoned=True),),
            PODS + (_running("c", "n3"),),
            3,
            0.2,
            {"n1": 1},
            NOW,
            [("drain", "n1", 1), ("perform_maintenance", "n1", 0)],
            "quiet",
        ),
        # busy, but the window is near: drain anyway
        (
            (_node("n1", AT, cordoned=True),),
            PODS + (_running("c", "n3"),),
            3,
            3.0,
            {"n1": 1},
            AT - 600,
            [("drain", "n1", 1), ("perform_maintenance", "n1", 0)],
            "not quiet, but the window is 600 s away",
        ),
        # replacement never came, window near: drain anyway, say so
        (
            (_node("n1", AT, cordoned=True),),
            PODS,
            3,
            0.0,
            {"n1": 1},
            AT - 100,
            [("drain", "n1", 1), ("perform_maintenance", "n1", 0)],
            "only 1/2 replicas Ready elsewhere",
        ),
        # 5. node empty: restore the surge, trigger maintenance
        (
            (_node("n1", AT, cordoned=True),),
            (_running("b", "n2"), _running("c", "n3")),
            3,
            0.0,
            {"n1": 1},
            NOW,
            [("restore", "n1", 1), ("perform_maintenance", "n1", 0)],
            "remove the surge",
        ),
        # node empty, maintenance already triggered, surge restored: nothing more
        ((_node("n1", AT, cordoned=True, **{LABEL_PERFORM: "true"}),), (_running("b", "n2"),), 1, 0.0, {}, NOW, [], ""),
        # maintenance already running: GKE owns it now
        (
            (_node("n1", AT, cordoned=True, **{LABEL_ACTIVE: "true"}),),
            PODS,
            2,
            0.0,
            {"n1": 1},
            NOW,
            [("none", "n1", 0)],
            "already started",
        ),
    ],
)
def test_maintenance_plan(
    nodes: tuple[NodeObs, ...],
    pods: tuple[PodObs, ...],
    desired: int,
    waiting: float,
    surged: dict[str, int],
    now: float,
    expected: list[tuple[str, str, int]],
    why: str,
) -> None:
    steps = maintenance_plan(nodes, pods, now, SPEC, desired_replicas=desired, waiting_requests=waiting, surged=surged)
    assert _kinds(steps) == expected
    assert all(s.reason for s in steps)
    if why:
        assert any(why in s.reason for s in steps), [s.reason for s in steps]


def test_earliest_window_first_and_idempotent() -> None:
    nodes = (_node("n2", NOW + 7200), _node("n1", NOW + 3600))
    first = maintenance_plan(nodes, PODS, NOW, SPEC, desired_replicas=2)
    assert [s.node for s in first] == ["n1", "n1", "n2", "n2"]
    assert first == maintenance_plan(nodes, PODS, NOW, SPEC, desired_replicas=2)


def test_a_whole_maintenance_walks_to_the_end() -> None:
    """Apply each step's effect to the observations and call again: the walk ends with the node empty."""
    pods = [_running("a", "n1"), _running("b", "n2")]
    node = _node("n1", AT)
    desired, surged, now, seen = 2, {}, NOW, []
    for _ in range(10):
        steps = maintenance_plan((node,), tuple(pods), now, SPEC, desired_replicas=desired, surged=surged)
        if not steps:
            break
        for step in steps:
            seen.append(step.kind)
            if step.kind == "cordon":
                node = NodeObs(node.name, node.accelerator, cordoned=True, labels=node.labels)
            elif step.kind == "surge":
                desired, surged = desired + step.count, {"n1": step.count}
                pods.append(_running("c", "n3"))
            elif step.kind == "drain":
                pods = [p for p in pods if p.node != "n1"]
            elif step.kind == "restore":
                desired, surged = desired - step.count, {}
            elif step.kind == "perform_maintenance":
                node = NodeObs(
                    node.name, node.accelerator, cordoned=True, labels={**node.labels, LABEL_PERFORM: "true"}
                )
        now += 30
    assert seen == ["cordon", "surge", "drain", "perform_maintenance", "restore"]
    assert desired == 2 and sum(1 for p in pods if p.ready) == 2


# -- after the maintenance, and without triggering it early ---------------------------------------------------
def _ours(name: str, at: float | None = None, ready: bool = True, **labels: str) -> NodeObs:
    node = _node(name, at, cordoned=True, **labels)
    return NodeObs(name, "tpu", ready=ready, cordoned=True, labels=node.labels, cordoned_by_interlude=True)


@pytest.mark.parametrize(
    ("nodes", "surged", "expected", "why"),
    [
        # maintenance over, surge still there, node Ready: restore and uncordon
        ((_ours("n1"),), {"n1": 1}, [("restore", "n1", 1), ("uncordon", "n1", 0)], "is over"),
        # maintenance over, node not Ready yet: restore, wait to uncordon
        ((_ours("n1", ready=False),), {}, [("wait", "n1", 0)], "waiting for it to be Ready"),
        # GKE made it schedulable again after its maintenance: drop the mark
        (
            (NodeObs("n1", "tpu", cordoned=False, cordoned_by_interlude=True),),
            {},
            [("uncordon", "n1", 0)],
            "schedulable again",
        ),
        # cordoned by someone else: never uncordoned by Interlude
        ((_node("n1", cordoned=True),), {}, [], ""),
        # the node was replaced (gone): restore its surge
        ((_node("n2"),), {"n1": 2}, [("restore", "n1", 2)], "is gone"),
        # maintenance running on a node Interlude cordoned: GKE owns it, nothing to undo yet
        ((_ours("n1", AT, **{LABEL_ACTIVE: "true"}),), {}, [("none", "n1", 0)], "already started"),
        # drained and triggered, maintenance not started yet: keep watching, uncordon later
        ((_ours("n1", AT, **{LABEL_PERFORM: "true"}),), {}, [("wait", "n1", 0)], "once its maintenance is over"),
    ],
)
def test_after_maintenance(
    nodes: tuple[NodeObs, ...], surged: dict[str, int], expected: list[tuple[str, str, int]], why: str
) -> None:
    steps = maintenance_plan(nodes, (_running("b", "n3"),), NOW, SPEC, desired_replicas=2, surged=surged)
    assert _kinds(steps) == expected
    assert in_flight(steps) == bool(expected)
    if why:
        assert any(why in s.reason for s in steps), [s.reason for s in steps]


@pytest.mark.parametrize("early", [True, False])
def test_perform_maintenance_early_is_a_choice(early: bool) -> None:
    spec = SPEC.replace(maintenance_perform_early=early)
    busy = maintenance_plan(
        (_node("n1", AT, cordoned=True),),
        PODS + (_running("c", "n3"),),
        NOW,
        spec,
        desired_replicas=3,
        surged={"n1": 1},
    )
    empty = maintenance_plan((_node("n1", AT, cordoned=True),), PODS[1:], NOW, spec, desired_replicas=2)
    assert [s.kind for s in busy] == (["drain", "perform_maintenance"] if early else ["drain"])
    assert [s.kind for s in empty] == (["perform_maintenance"] if early else [])


@dataclass
class _World:
    """What the cluster looks like to the policy while a walk applies its steps."""

    node: NodeObs
    pods: list[PodObs]
    desired: int = 2
    surged: dict[str, int] = field(default_factory=dict)


def _effect(w: _World, step: Step) -> None:
    labels = dict(w.node.labels)
    if step.kind == "cordon":
        w.node = NodeObs("n1", "tpu", cordoned=True, labels=labels, cordoned_by_interlude=True)
    elif step.kind == "surge":
        w.desired, w.surged = w.desired + step.count, {"n1": step.count}
        w.pods.append(_running("c", "n3"))
    elif step.kind == "drain":
        w.pods = [p for p in w.pods if p.node != "n1"]
    elif step.kind == "restore":
        w.desired, w.surged = w.desired - step.count, {}
    elif step.kind == "perform_maintenance":
        labels[LABEL_PERFORM] = "true"
        w.node = NodeObs("n1", "tpu", cordoned=True, labels=labels, cordoned_by_interlude=True)
    elif step.kind == "uncordon":
        w.node = NodeObs("n1", "tpu", cordoned=False)


def test_a_whole_maintenance_with_the_node_coming_back_ends_in_the_normal_shape() -> None:
    """Cordon, surge, drain, trigger, restore, then GKE's maintenance runs and ends: uncordon, nothing left."""
    w = _World(_node("n1", AT), [_running("a", "n1"), _running("b", "n2")])
    seen: list[str] = []
    for tick in range(12):
        if w.node.labels.get(LABEL_PERFORM) == "true" and tick > 6:  # GKE: maintenance done, labels gone
            w.node = NodeObs("n1", "tpu", ready=True, cordoned=w.node.cordoned, cordoned_by_interlude=True)
        steps = maintenance_plan(
            (w.node,), tuple(w.pods), NOW + 30 * tick, SPEC, desired_replicas=w.desired, surged=w.surged
        )
        if not in_flight(steps):
            break
        for step in steps:
            seen.append(step.kind)
            _effect(w, step)
    assert [k for k in seen if k != "wait"] == [
        "cordon",
        "surge",
        "drain",
        "perform_maintenance",
        "restore",
        "uncordon",
    ]
    assert w.desired == 2 and not w.node.cordoned and w.surged == {}


@pytest.mark.parametrize(("time_scale", "expected"), [(1.0, ["drain", "perform_maintenance"]), (600.0, ["wait"])])
def test_the_margin_is_google_real_seconds_on_a_faster_clock(time_scale: float, expected: list[str]) -> None:
    """The label is wall-clock epoch seconds; on a cloud whose clock runs 600x faster the 600 s margin is 1 s of
    wall clock. The window 300 s away, busy, one replica short: within Google's margin (drain), not within 1 s
    at 600x (wait for replacements)."""
    steps = maintenance_plan(
        (_node("n1", NOW + 300, cordoned=True),),
        PODS,
        NOW,
        SPEC,
        desired_replicas=3,
        waiting_requests=3.0,
        surged={"n1": 1},
        time_scale=time_scale,
    )
    assert [s.kind for s in steps] == expected
    with pytest.raises(ValueError, match="time_scale"):
        maintenance_plan((), PODS, NOW, SPEC, desired_replicas=2, time_scale=0)
