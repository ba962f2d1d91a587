"""Discovery-document validation and enum (de)coding."""

from __future__ import annotations

import json

from interlude_localcloud import discovery


def test_validator_catches_unknown_fields_bad_enums_and_missing_outputs() -> None:
    errs = discovery.validate("tpu.v2", "Node", {"state": "SLEEPY", "colour": 1, "createTime": "yesterday"})
    text = " | ".join(errs)
    assert "SLEEPY" in text and "colour" in text and "RFC3339" in text and "'name'" in text


def test_valid_node_passes_in_both_encodings() -> None:
    node = {
        "name": "projects/p/locations/z/nodes/n",
        "state": "READY",
        "health": "HEALTHY",
        "createTime": "2026-01-01T00:00:00.000Z",
        "acceleratorType": "v6e-8",
        "runtimeVersion": "v",
        "acceleratorConfig": {"type": "V6E", "topology": "2x4"},
        "id": "123",
    }
    assert discovery.validate("tpu.v2", "Node", node) == []
    numbered = discovery.enums_to_numbers("tpu.v2", "Node", node)
    assert numbered["state"] == 2 and numbered["acceleratorConfig"]["type"] == 11
    assert discovery.validate("tpu.v2", "Node", numbered, int_enums=True) == []
    assert discovery.enums_to_names("tpu.v2", "Node", numbered) == node


def test_the_shipped_enum_numbers_are_the_installed_protos_numbers() -> None:
    """The server reads enum numbers from a file (importing the client packages costs each cloud ~0.5 CPU-s); a
    client upgrade that renumbers or adds an enum fails here. To write the file again:
    `cd include && python -c "import json; from interlude_localcloud import discovery as d;
    d.ENUM_NUMBERS_FILE.write_text(json.dumps(d.enum_numbers_document(), indent=1, sort_keys=True) + chr(10))"`"""
    assert json.loads(discovery.ENUM_NUMBERS_FILE.read_text()) == discovery.enum_numbers_document()
    for family in ("tpu", "container"):
        assert discovery._proto_enum_numbers(family) == discovery.proto_enum_numbers(family)
    assert discovery.proto_enum_numbers("tpu")[("Node", "state")]["STOPPED"] == 8  # a gap discovery order misses


def test_proto_numbers_have_gaps_that_discovery_order_misses() -> None:
    numbered = discovery.enums_to_numbers("tpu.v2", "Node", {"state": "PREEMPTED", "health": "UNHEALTHY_MAINTENANCE"})
    assert numbered == {"state": 11, "health": 5}


QR_TEMPLATE_NODE = {"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e", "labels": {"run": "x"}}


def _queued_resource(**overrides: object) -> dict[str, object]:
    qr: dict[str, object] = {
        "name": "projects/p/locations/z/queuedResources/q",
        "createTime": "2026-01-01T00:00:00Z",
        "state": {"state": "ACTIVE", "stateInitiator": "SERVICE", "activeData": {}},
        "tpu": {"nodeSpec": [{"parent": "projects/p/locations/z", "nodeId": "n", "node": QR_TEMPLATE_NODE}]},
        "spot": {},
    }
    qr.update(overrides)
    return qr


def test_queued_resource_node_spec_node_is_a_template_without_output_fields() -> None:
    # tpu.v2.json: NodeSpec.node is "Required. The node." (an input the user sent); Node.name,
    # state and createTime are readOnly "Output only", so Google's echo of the template lacks them.
    spec = discovery.load("tpu.v2")["schemas"]
    assert spec["NodeSpec"]["properties"]["node"]["description"].startswith("Required.")
    assert all(spec["Node"]["properties"][f].get("readOnly") for f in ("name", "state", "createTime"))
    for doc in ("tpu.v2", "tpu.v2alpha1"):
        assert discovery.validate(doc, "QueuedResource", _queued_resource()) == []
        listed = {"queuedResources": [_queued_resource(), _queued_resource()]}
        assert discovery.validate(doc, "ListQueuedResourcesResponse", listed) == []


def test_served_resources_still_need_their_output_fields() -> None:
    qr = _queued_resource()
    del qr["createTime"]
    missing = ["$: output field 'createTime' of QueuedResource not set"]
    assert discovery.validate("tpu.v2", "QueuedResource", qr) == missing
    listed = discovery.validate("tpu.v2", "ListQueuedResourcesResponse", {"queuedResources": [qr]})
    assert listed == ["$.queuedResources[0]: output field 'createTime' of QueuedResource not set"]
    nodes = discovery.validate("tpu.v2", "ListNodesResponse", {"nodes": [QR_TEMPLATE_NODE]})
    assert {e.split(": ")[1] for e in nodes} == {
        "output field 'name' of Node not set",
        "output field 'state' of Node not set",
        "output field 'createTime' of Node not set",
    }
    instances = discovery.validate("compute.v1", "InstanceList", {"items": [{"name": "vm"}]})
    assert any("output field 'status' of Instance" in e for e in instances)
    # The template is still checked for unknown fields and enum values.
    bad = _queued_resource(tpu={"nodeSpec": [{"nodeId": "n", "node": {**QR_TEMPLATE_NODE, "colour": 1}}]})
    assert discovery.validate("tpu.v2", "QueuedResource", bad) == [
        "$.tpu.nodeSpec[0].node: unknown field 'colour' in Node"
    ]
