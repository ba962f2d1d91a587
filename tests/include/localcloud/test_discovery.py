"""Discovery-document validation and enum (de)coding."""

from __future__ import annotations

from interlude_localcloud import discovery


def test_validator_catches_unknown_fields_bad_enums_and_missing_outputs() -> None:
    errs = discovery.validate("tpu.v2", "Node", {"state": "SLEEPY", "colour": 1, "createTime": "yesterday"})
    text = " | ".join(errs)
    assert "SLEEPY" in text and "colour" in text and "RFC3339" in text and "'name'" in text


def test_valid_node_passes_in_both_encodings() -> None:
    node = {"name": "projects/p/locations/z/nodes/n", "state": "READY", "health": "HEALTHY",
            "createTime": "2026-01-01T00:00:00.000Z", "acceleratorType": "v6e-8", "runtimeVersion": "v",
            "acceleratorConfig": {"type": "V6E", "topology": "2x4"}, "id": "123"}
    assert discovery.validate("tpu.v2", "Node", node) == []
    numbered = discovery.enums_to_numbers("tpu.v2", "Node", node)
    assert numbered["state"] == 2 and numbered["acceleratorConfig"]["type"] == 11
    assert discovery.validate("tpu.v2", "Node", numbered, int_enums=True) == []
    assert discovery.enums_to_names("tpu.v2", "Node", numbered) == node


def test_proto_numbers_have_gaps_that_discovery_order_misses() -> None:
    numbered = discovery.enums_to_numbers("tpu.v2", "Node", {"state": "PREEMPTED", "health": "UNHEALTHY_MAINTENANCE"})
    assert numbered == {"state": 11, "health": 5}
