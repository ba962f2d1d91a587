"""TPU v2 through the real google-cloud-tpu REST client: nodes, operations, catalog, queued resources."""

from __future__ import annotations

import time

import pytest
import requests
from google.api_core import exceptions
from google.cloud import tpu_v2

from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import ZONE


def parent(lc: RunningLocalCloud, zone: str = ZONE) -> str:
    return f"projects/{lc.project}/locations/{zone}"


def v6e(**kw: object) -> tpu_v2.Node:
    return tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e", **kw)


def test_node_create_get_list_delete(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    op = tpu.create_node(parent=parent(lc), node_id="n1", node=v6e(labels={"run": "r1"}))
    assert tpu.get_node(name=f"{parent(lc)}/nodes/n1").state == tpu_v2.Node.State.CREATING
    node = op.result(timeout=10)
    assert node.state == tpu_v2.Node.State.READY
    assert node.health == tpu_v2.Node.Health.HEALTHY
    assert node.accelerator_config.type_ == tpu_v2.AcceleratorConfig.Type.V6E
    assert node.network_endpoints[0].port == 8470
    assert [n.name for n in tpu.list_nodes(parent=parent(lc))] == [node.name]
    ops = tpu.list_operations(request={"name": parent(lc)}).operations
    assert any(o.done for o in ops)
    tpu.delete_node(name=node.name).result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=node.name)


def test_enum_numbers_in_requests_and_names_for_plain_rest(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    # The proto client sends acceleratorConfig.type as the number 11 (V6E) and reads numbers back.
    node = tpu_v2.Node(
        runtime_version="v2-alpha-tpuv6e", accelerator_config=tpu_v2.AcceleratorConfig(type_="V6E", topology="2x4")
    )
    got = tpu.create_node(parent=parent(lc), node_id="cfg", node=node).result(timeout=10)
    assert got.accelerator_type == "v6e-8"
    raw = requests.get(f"{lc.api_endpoint}/v2/{got.name}", timeout=5).json()
    assert raw["state"] == "READY" and raw["acceleratorConfig"]["type"] == "V6E"
    num = requests.get(f"{lc.api_endpoint}/v2/{got.name}?$alt=json;enum-encoding=int", timeout=5).json()
    assert num["state"] == 2 and num["health"] == 1 and num["acceleratorConfig"]["type"] == 11


def test_catalog(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    assert [a.type_ for a in tpu.list_accelerator_types(parent=parent(lc))] == ["v5litepod-8", "v6e-8"]
    assert {v.version for v in tpu.list_runtime_versions(parent=parent(lc))} == {
        "v2-alpha-tpuv5-lite",
        "v2-alpha-tpuv6e",
    }
    with pytest.raises(exceptions.NotFound):
        tpu.get_accelerator_type(name=f"{parent(lc)}/acceleratorTypes/v4-8")


def test_google_shaped_errors(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=f"{parent(lc)}/nodes/nope")
    with pytest.raises(exceptions.NotFound):
        tpu.list_nodes(parent=parent(lc, "mars-central1-a"))
    with pytest.raises(exceptions.BadRequest):
        tpu.create_node(
            parent=parent(lc),
            node_id="bad",
            node=tpu_v2.Node(accelerator_type="v9z-8", runtime_version="v2-alpha-tpuv6e"),
        )
    tpu.create_node(parent=parent(lc), node_id="dup", node=v6e()).result(timeout=10)
    with pytest.raises(exceptions.Conflict):  # 409 ALREADY_EXISTS, as Google answers it
        tpu.create_node(parent=parent(lc), node_id="dup", node=v6e())
    r = requests.post(f"{lc.api_endpoint}/v2/{parent(lc)}/nodes?nodeId=x", data="{not json", timeout=5)
    assert r.status_code == 400
    assert r.json()["error"]["status"] == "INVALID_ARGUMENT" and r.json()["error"]["code"] == 400
    r = requests.post(f"{lc.api_endpoint}/v2/{parent(lc)}/nodes?nodeId=x", json={"bogusField": 1}, timeout=5)
    assert r.status_code == 400 and "bogusField" in r.json()["error"]["message"]
    r = requests.get(f"{lc.api_endpoint}/v2/{parent(lc)}/nodes/nope", timeout=5)
    assert r.json() == {"error": {"code": 404, "message": r.json()["error"]["message"], "status": "NOT_FOUND"}}


def test_n_plus_one_create_stocks_out(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    # v5litepod-8 capacity in the fast scenario is 1 node.
    node = tpu_v2.Node(accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite")
    first = tpu.create_node(parent=parent(lc), node_id="a", node=node).result(timeout=10)
    op = tpu.create_node(parent=parent(lc), node_id="b", node=node)
    with pytest.raises(exceptions.GoogleAPICallError) as err:
        op.result(timeout=10)
    assert 'There is no more capacity in the zone "us-central1-a"' in str(err.value)
    raw = requests.get(f"{lc.api_endpoint}/v2/{op.operation.name}", timeout=5).json()
    assert raw["done"] is True and raw["error"]["code"] == 8
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=f"{parent(lc)}/nodes/b")
    # Deleting releases the capacity: the same create now works.
    tpu.delete_node(name=first.name).result(timeout=10)
    assert tpu.create_node(parent=parent(lc), node_id="b", node=node).result(timeout=10).state == 2


def test_queued_resource_waits_then_becomes_active(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    node = tpu_v2.Node(accelerator_type="v5litepod-8", runtime_version="v2-alpha-tpuv5-lite")
    blocker = tpu.create_node(parent=parent(lc), node_id="blocker", node=node).result(timeout=10)
    qr = tpu_v2.QueuedResource(
        tpu=tpu_v2.QueuedResource.Tpu(
            node_spec=[tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent(lc), node_id="queued-node", node=node)]
        )
    )
    tpu.create_queued_resource(parent=parent(lc), queued_resource_id="q1", queued_resource=qr).result(timeout=10)
    name = f"{parent(lc)}/queuedResources/q1"
    waiting = tpu_v2.QueuedResourceState.State.WAITING_FOR_RESOURCES
    deadline = time.time() + 10
    while tpu.get_queued_resource(name=name).state.state != waiting:
        assert time.time() < deadline, "the queued resource never waited for resources"
        time.sleep(0.05)
    time.sleep(0.5)
    assert tpu.get_queued_resource(name=name).state.state == waiting
    tpu.delete_node(name=blocker.name).result(timeout=10)
    deadline = time.time() + 10
    while tpu.get_queued_resource(name=name).state.state != tpu_v2.QueuedResourceState.State.ACTIVE:
        assert time.time() < deadline, "the queued resource never became ACTIVE once the blocker was deleted"
        time.sleep(0.05)
    got = tpu.get_node(name=f"{parent(lc)}/nodes/queued-node")
    assert got.state == tpu_v2.Node.State.READY and got.queued_resource == name
    assert [q.name for q in tpu.list_queued_resources(parent=parent(lc))] == [name]
    with pytest.raises(exceptions.BadRequest):
        tpu.delete_queued_resource(name=name)  # has a node; needs force
    tpu.delete_queued_resource(request={"name": name, "force": True}).result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        tpu.get_node(name=f"{parent(lc)}/nodes/queued-node")


def test_stop_start_patch(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    node = tpu.create_node(parent=parent(lc), node_id="s", node=v6e()).result(timeout=10)
    assert tpu.stop_node(request={"name": node.name}).result(timeout=10).state == tpu_v2.Node.State.STOPPED
    assert tpu.start_node(request={"name": node.name}).result(timeout=10).state == tpu_v2.Node.State.READY
    patched = tpu.update_node(
        node=tpu_v2.Node(name=node.name, labels={"k": "v"}), update_mask={"paths": ["labels"]}
    ).result(timeout=10)
    assert patched.labels == {"k": "v"}
