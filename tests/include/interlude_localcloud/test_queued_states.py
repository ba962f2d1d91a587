"""Queued resources ending as Google ends them, through the real google-cloud-tpu REST client: FAILED when
`queueingPolicy.validUntilDuration` passes while waiting (FailedData carries the error), and a spot
queued resource whose node is preempted goes SUSPENDING then SUSPENDED with its node deleted
(https://cloud.google.com/tpu/docs/queued-resources; QueuedResourceState in the TPU v2 reference)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from google.api_core import exceptions
from google.cloud import tpu_v2
from google.protobuf import duration_pb2

from interlude_localcloud.testing import RunningLocalCloud

from .conftest import ZONE

State = tpu_v2.QueuedResourceState.State


def parent(lc: RunningLocalCloud) -> str:
    return f"projects/{lc.project}/locations/{ZONE}"


def wait_state(tpu: tpu_v2.TpuClient, name: str, ok: Callable[[tpu_v2.QueuedResource], bool]) -> tpu_v2.QueuedResource:
    deadline = time.time() + 20
    while not ok(qr := tpu.get_queued_resource(name=name)):
        assert time.time() < deadline, f"{name} still {qr.state.state.name}"
        time.sleep(0.05)
    return qr


def test_a_waiting_request_fails_at_its_valid_until_duration(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    node = tpu_v2.Node(accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite")
    blocker = tpu.create_node(parent=parent(lc), node_id="blocker", node=node).result(timeout=10)
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent(lc), node_id="late", node=node)]
        ),
        # two Google hours: about two seconds at this scenario's time scale (3600)
        queueing_policy=tpu_v2.QueuedResource.QueueingPolicy(valid_until_duration=duration_pb2.Duration(seconds=7200)),
    )
    tpu.create_queued_resource(parent=parent(lc), queued_resource_id="q-late", queued_resource=qr).result(timeout=10)
    name = f"{parent(lc)}/queuedResources/q-late"
    wait_state(tpu, name, lambda q: q.state.state == State.WAITING_FOR_RESOURCES)
    failed = wait_state(tpu, name, lambda q: q.state.state == State.FAILED)
    assert failed.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    assert failed.state.failed_data.error.message, failed.state
    # Capacity freed after the deadline changes nothing: a FAILED request is over.
    tpu.delete_node(name=blocker.name).result(timeout=10)
    time.sleep(0.5)
    assert tpu.get_queued_resource(name=name).state.state == State.FAILED
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=f"{parent(lc)}/nodes/late")
    tpu.delete_queued_resource(name=name).result(timeout=10)
    assert not list(tpu.list_queued_resources(parent=parent(lc)))


def test_a_preempted_spot_request_is_suspended_and_its_node_deleted(
    lc: RunningLocalCloud, tpu: tpu_v2.TpuClient
) -> None:
    node = tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e")
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent(lc), node_id="spotty", node=node)]
        ),
        spot=tpu_v2.QueuedResource.Spot(),
    )
    tpu.create_queued_resource(parent=parent(lc), queued_resource_id="q-spot", queued_resource=qr).result(timeout=10)
    name = f"{parent(lc)}/queuedResources/q-spot"
    wait_state(tpu, name, lambda q: q.state.state == State.ACTIVE)
    lc.admin.preempt("tpu", ZONE, "spotty")
    wait_state(tpu, name, lambda q: q.state.state in (State.SUSPENDING, State.SUSPENDED))
    suspended = wait_state(tpu, name, lambda q: q.state.state == State.SUSPENDED)
    assert suspended.state.state_initiator == tpu_v2.QueuedResourceState.StateInitiator.SERVICE
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=f"{parent(lc)}/nodes/spotty")
    tpu.delete_queued_resource(name=name).result(timeout=10)
    assert not [m for m in lc.admin.machines() if m["name"] == "spotty"]
