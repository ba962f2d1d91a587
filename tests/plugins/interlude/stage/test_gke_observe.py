"""The GKE stage's decisions, pure: a notice asks for a checkpoint, the drain is waited out, the recreated pod's
workload closes the event with what it says itself; JobSet failures, stalls and a workload that never comes back
fail the stage."""

from __future__ import annotations

from typing import Any

import pytest

from interlude.stage.gke_observe import (
    COMPLETE,
    DRAINING,
    DRILL,
    DRILL_DONE,
    DRILL_PENDING,
    DRILL_SENT,
    FAIL,
    MOVE,
    NOTICED,
    RECORD_EVENT,
    REQUEST_CHECKPOINT,
    RUNNING,
    GkeObservation,
    GkeStageState,
    NodeSeen,
    PodSeen,
    jobset_failure,
    next_gke_step,
    observation_from,
)

WINDOW = 1_796_000_000.0
T0 = WINDOW - 100
POD_A, POD_B = PodSeen("js-slice-0-0-a", "uid-a", "Running", "n1"), PodSeen("js-slice-0-0-b", "uid-b", "Running", "n1")
QUIET, NOTICE = NodeSeen("n1"), NodeSeen("n1", {"cloud.google.com/scheduled-maintenance-time": str(int(WINDOW))})


def obs(
    now: float,
    pods: tuple[PodSeen, ...] = (POD_A,),
    node: NodeSeen = QUIET,
    step: int = 0,
    committed: int = 0,
    boot: str | None = "uid-a",
    ack: int | None = None,
    **progress: Any,
) -> GkeObservation:
    return GkeObservation(now, pods, {"n1": node}, committed, {"boot_id": boot, "step": step, **progress}, ack)


def step(state: GkeStageState, o: GkeObservation) -> Any:
    return next_gke_step(state, o, stall_timeout=60, down_timeout=120)


def test_a_maintenance_from_notice_to_resume() -> None:
    s = step(GkeStageState(target_step=60), obs(T0, step=12, committed=10)).state
    assert s.phase == RUNNING and s.pod_uid == "uid-a" and s.boot_id == "uid-a"
    noticed = step(s, obs(T0 + 1, node=NOTICE, step=14, committed=10))
    assert noticed.actions == (REQUEST_CHECKPOINT,) and noticed.state.phase == NOTICED and noticed.state.request_id
    assert noticed.state.event["window_start"] == WINDOW and noticed.state.event["node"] == "n1"
    acked = step(noticed.state, obs(T0 + 2, node=NOTICE, step=15, committed=15, ack=15))
    assert acked.actions == () and acked.state.event["checkpoint_step"] == 15
    trained_on = step(acked.state, obs(T0 + 5, node=NOTICE, step=31, committed=30, ack=15))
    assert trained_on.state.phase == NOTICED and trained_on.state.last_step_seen == 31
    drained = step(trained_on.state, obs(T0 + 6, pods=(), node=NOTICE, step=31, committed=31, ack=15))
    assert drained.state.phase == DRAINING and drained.state.event["step_at_down"] == 31
    pending = step(drained.state, obs(T0 + 8, pods=(PodSeen("js-b", "uid-b", "Pending"),), step=31, committed=31))
    assert pending.actions == () and pending.state.phase == DRAINING
    booted = dict(resumed_from=31, boot_started_at=T0 + 9, previous_boot_ended_at=T0 + 6, stepping_at_epoch=T0 + 11)
    starting = step(pending.state, obs(T0 + 10, pods=(POD_B,), boot="uid-b", step=31, committed=31, **booted))
    assert starting.actions == (), "not closed before it stepped past its resume point"
    closed = step(starting.state, obs(T0 + 12, pods=(POD_B,), boot="uid-b", step=33, committed=31, **booted))
    assert closed.actions == (RECORD_EVENT,)
    event = closed.event
    assert event["resumed_from_step"] == 31 and event["checkpoint_step"] == 31 and event["steps_recomputed"] == 0
    assert event["downtime_s"] == pytest.approx(3.0) and event["platform"] == "gke"
    assert closed.state.phase == RUNNING and closed.state.pod_uid == "uid-b" and closed.state.boot_id == "uid-b"
    done = step(closed.state, obs(T0 + 20, pods=(POD_B,), boot="uid-b", step=60, committed=60))
    assert done.actions == (COMPLETE,)


def test_steps_past_the_resume_point_are_counted_as_recomputed() -> None:
    s = GkeStageState(target_step=60, phase=DRAINING, pod_uid="uid-a", boot_id="uid-a", last_step_seen=37)
    s = GkeStageState(**{**s.to_dict(), "event": {"step_at_down": 37, "step_at_detection": 20, "down_at": T0}})
    closed = step(s, obs(T0 + 5, pods=(POD_B,), boot="uid-b", step=33, committed=30, resumed_from=30))
    assert closed.event["steps_recomputed"] == 7


def test_the_stage_fails_on_a_failed_jobset_a_stall_and_a_workload_that_never_returns() -> None:
    failed = GkeObservation(T0, (), {}, 0, {}, None, "ReachedMaxRestarts: jobset failed")
    assert step(GkeStageState(target_step=60), failed).actions == (FAIL,)
    s = step(GkeStageState(target_step=60), obs(T0, step=5)).state
    assert step(s, obs(T0 + 59, step=5)).actions == ()
    stalled = step(s, obs(T0 + 61, step=5))
    assert stalled.actions == (FAIL,) and "stall" in stalled.reason
    gone = GkeStageState(target_step=60, phase=DRAINING, boot_id="uid-a", event={"down_at": T0})
    assert step(gone, obs(T0 + 119, pods=(), boot="uid-a")).actions == ()
    lost = step(gone, obs(T0 + 121, pods=(), boot="uid-a"))
    assert lost.actions == (FAIL,) and "did not come back" in lost.reason


def test_a_draining_node_without_the_label_is_a_notice_too() -> None:
    tainted = NodeSeen("n1", {}, tainted=True)
    s = step(GkeStageState(target_step=60), obs(T0, step=3)).state
    assert step(s, obs(T0 + 1, node=tainted, step=4)).actions == (REQUEST_CHECKPOINT,)
    assert NodeSeen("n1", {"cloud.google.com/scheduled-maintenance-time": "soon"}).maintenance_at() is None


def test_observation_from_kubernetes_objects() -> None:
    pods = [
        {"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}},
        {"metadata": {"name": "q", "uid": "v", "deletionTimestamp": "x"}, "spec": {}, "status": {"phase": "Running"}},
    ]
    nodes = [
        {
            "metadata": {"name": "n1", "labels": {}},
            "spec": {"taints": [{"key": "cloud.google.com/impending-node-termination"}]},
        }
    ]
    jobset = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "R", "message": "m"}]}}
    o = observation_from(T0, pods, nodes, 3, {"step": 4}, None, jobset)
    assert o.pods == (PodSeen("p", "u", "Running", "n1"),) and o.nodes["n1"].tainted and o.jobset_failure == "R: m"
    assert jobset_failure(None) and jobset_failure({"status": {}}) is None


def test_a_pool_that_cannot_get_its_node_back_asks_for_a_move() -> None:
    """After the drain, the pending pod's FailedScaleUp "GCE out of resources" (the autoscaler's stockout) is a MOVE;
    the same Event about another pod, or a scale-up that failed for another reason, is not."""
    drained = GkeStageState(target_step=60, phase=DRAINING, boot_id="uid-a", event={"down_at": T0, "step_at_down": 31})
    pending = {"metadata": {"name": "js-b", "uid": "uid-b"}, "spec": {}, "status": {"phase": "Pending"}}

    def event(pod: str, reason: str, message: str) -> dict[str, Any]:
        return {"involvedObject": {"kind": "Pod", "name": pod}, "reason": reason, "message": message}

    out = "Node scale up in zones us-central1-a associated with this pod failed: GCE out of resources."
    seen = observation_from(
        T0 + 5, [pending], [], 31, {"boot_id": "uid-a"}, None, {}, [event("js-b", "FailedScaleUp", out)]
    )
    moved = step(drained, seen)
    assert moved.actions == (MOVE,) and "GCE out of resources" in moved.reason and moved.state.phase == DRAINING
    assert moved.state.event["step_at_down"] == 31, "the event travels on: the new pod's resume closes it"
    for other in (event("js-a", "FailedScaleUp", out), event("js-b", "FailedScaleUp", "failed: quota exceeded")):
        quiet = observation_from(T0 + 5, [pending], [], 31, {"boot_id": "uid-a"}, None, {}, [other])
        assert quiet.scale_up_failure is None and step(drained, quiet).actions == ()


ZONED = NodeSeen("n1", {"topology.kubernetes.io/zone": "us-central1-a"})
ZONED_NOTICE = NodeSeen("n1", {**ZONED.labels, **NOTICE.labels})


def test_a_drill_goes_to_the_pods_node_when_the_workload_holds_and_its_notice_is_the_drills_event() -> None:
    s = GkeStageState(target_step=60, drill=DRILL_PENDING, drill_step=10)
    training = step(s, obs(T0, node=ZONED, step=8, committed=0, state="running"))
    assert training.actions == () and training.state.drill == DRILL_PENDING
    held = step(training.state, obs(T0 + 1, node=ZONED, step=10, committed=10, state="holding"))
    assert held.actions == (DRILL,), held.reason
    assert (held.state.drill, held.state.drill_node, held.state.drill_zone) == (DRILL_SENT, "n1", "us-central1-a")
    assert held.state.drill_sent_at == T0 + 1
    waiting = step(held.state, obs(T0 + 2, node=ZONED, step=10, committed=10, state="holding"))
    assert waiting.actions == (), "sent once"
    noticed = step(waiting.state, obs(T0 + 3, node=ZONED_NOTICE, step=10, committed=10, state="holding"))
    assert noticed.actions == (REQUEST_CHECKPOINT,) and noticed.state.drill == DRILL_DONE
    event = noticed.state.event
    assert event["drill"] is True and event["drill_step"] == 10 and event["drill_sent_at"] == T0 + 1


def test_a_workload_that_cannot_hold_gets_the_drill_as_it_passes_its_step_and_a_node_without_zone_waits() -> None:
    s = GkeStageState(target_step=60, drill=DRILL_PENDING, drill_step=10)
    assert step(s, obs(T0, node=QUIET, step=11, committed=10)).actions == (), "no zone on the node: nowhere to send"
    assert step(s, obs(T0, node=ZONED, step=11, committed=10)).actions == (DRILL,)


def test_a_drill_that_never_shows_or_never_ran_fails_the_stage_saying_so() -> None:
    sent = GkeStageState(target_step=60, drill=DRILL_SENT, drill_step=10, drill_sent_at=T0, drill_node="n1")
    late = next_gke_step(sent, obs(T0 + 31, node=ZONED, step=10, committed=10), 600, 120, drill_timeout=30)
    assert late.actions == (FAIL,) and "no maintenance showed on it within 31s" in late.reason
    assert next_gke_step(sent, obs(T0 + 29, node=ZONED, step=10, committed=10), 600, 120, 30).actions == ()
    pending = GkeStageState(target_step=60, drill=DRILL_PENDING, drill_step=10)
    done = step(pending, obs(T0, pods=(), node=ZONED, step=60, committed=60))
    assert done.actions == (FAIL,) and "could not run" in done.reason
    finished = step(sent, obs(T0 + 1, node=ZONED, step=60, committed=60))
    assert finished.actions == (FAIL,) and "finished without a maintenance" in finished.reason
    ok = step(GkeStageState(target_step=60, drill=DRILL_DONE, drill_step=10), obs(T0, step=60, committed=60))
    assert ok.actions == (COMPLETE,)


@pytest.mark.parametrize("awaits", [False, True])
@pytest.mark.parametrize("exported", [False, True])
@pytest.mark.parametrize("failed", [False, True])
def test_a_stage_that_exports_is_done_only_with_its_export_on_gke_too(
    awaits: bool, exported: bool, failed: bool
) -> None:
    """The same rule as the VM stage's (interlude.stage.machine): at the committed final step, done when no export is
    awaited or it is in; a workload that said it failed (its export did not reproduce the model) fails the stage
    with its words; else the look goes on."""
    from dataclasses import replace

    state = GkeStageState(target_step=10, awaits_export=awaits)
    words = {"state": "failed", "error": "the Hugging Face export of committed step 10 failed"} if failed else {}
    seen = replace(obs(T0, step=10, committed=10, **words), export_committed=exported)
    out = step(state, seen)
    if not awaits or exported:
        assert out.actions == (COMPLETE,), out
    elif failed:
        assert out.actions == (FAIL,) and "export of committed step 10 failed" in out.reason, out
    else:
        assert out.actions == (), out
    assert GkeStageState.from_dict(state.to_dict()) == state
