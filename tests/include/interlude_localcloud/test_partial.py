"""Partial responses (the ``fields`` system parameter): the syntax, the selection, and the HTTP front's answers."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from google.cloud import tpu_v2

from interlude_localcloud import partial
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.conftest import ZONE
from tests.include.interlude_localcloud.test_tpu_api import parent, v6e

NODE: dict[str, Any] = {
    "name": "projects/p/locations/z/nodes/n1",
    "state": "READY",
    "health": "HEALTHY",
    "acceleratorConfig": {"type": "V6E", "topology": "2x4"},
    "networkEndpoints": [{"ipAddress": "10.0.0.2", "port": 8470}, {"ipAddress": "10.0.0.3", "port": 8470}],
    "labels": {"run": "r1", "team": "ml"},
}


@pytest.mark.parametrize(
    ("spec", "tree"),
    [
        ("name", {"name": None}),
        ("name,state", {"name": None, "state": None}),
        ("nodes(name,state),nextPageToken", {"nodes": {"name": None, "state": None}, "nextPageToken": None}),
        ("a/b/c", {"a": {"b": {"c": None}}}),
        ("a/b,a/c", {"a": {"b": None, "c": None}}),
        ("a(b/c,d)", {"a": {"b": {"c": None}, "d": None}}),
        ("a,a/b", {"a": None}),  # a field selected whole stays whole
        ("a/b,a", {"a": None}),
        ("*", {"*": None}),
        (" nodes( name , state ) ", {"nodes": {"name": None, "state": None}}),
    ],
)
def test_the_fields_syntax_parses_to_a_selection(spec: str, tree: partial.Selection) -> None:
    assert partial.parse(spec) == tree


@pytest.mark.parametrize("spec", ["", "a(", "a(b", "a)", "a,,b", "a/", "/a", "(a)", "a(b)c", "a b", "a;b", "a()"])
def test_a_malformed_selection_is_refused(spec: str) -> None:
    with pytest.raises(partial.FieldsError):
        partial.parse(spec)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("name", {"name": NODE["name"]}),
        ("name,upcomingMaintenance", {"name": NODE["name"]}),  # a field the resource lacks is omitted
        ("acceleratorConfig/type", {"acceleratorConfig": {"type": "V6E"}}),
        ("networkEndpoints/ipAddress", {"networkEndpoints": [{"ipAddress": "10.0.0.2"}, {"ipAddress": "10.0.0.3"}]}),
        ("labels/run", {"labels": {"run": "r1"}}),
        ("labels", {"labels": NODE["labels"]}),
        ("*", NODE),
        ("acceleratorConfig(*)", {"acceleratorConfig": NODE["acceleratorConfig"]}),
    ],
)
def test_a_selection_keeps_only_the_selected_fields(spec: str, expected: dict[str, Any]) -> None:
    assert partial.select(NODE, partial.parse(spec)) == expected


def test_a_selection_inside_a_list_applies_to_each_element() -> None:
    body = {"nodes": [NODE, {**NODE, "name": "n2", "state": "STOPPED"}], "nextPageToken": "t"}
    got = partial.select(body, partial.parse("nodes(name,state)"))
    assert got == {"nodes": [{"name": NODE["name"], "state": "READY"}, {"name": "n2", "state": "STOPPED"}]}


@pytest.mark.parametrize(
    ("doc", "schema", "spec", "ok"),
    [
        ("tpu.v2", "ListNodesResponse", "nodes(name,state,health,upcomingMaintenance),nextPageToken", True),
        ("tpu.v2", "ListNodesResponse", "nodes(name,stat)", False),
        ("tpu.v2", "ListNodesResponse", "node(name)", False),
        ("tpu.v2", "Node", "labels/anything,networkEndpoints/ipAddress", True),  # a map takes any key
        ("tpu.v2", "Node", "networkEndpoints/ipAdress", False),
        ("compute.v1", "InstanceList", "items(name,status,resourceStatus,scheduling),nextPageToken", True),
        ("compute.v1", "InstanceList", "items(name,state)", False),  # a TPU field on a VM
        ("compute.v1", "InstanceList", "items/resourceStatus/upcomingMaintenance/windowStartTime", True),
    ],
)
def test_a_selection_is_checked_against_the_discovery_schema(doc: str, schema: str, spec: str, ok: bool) -> None:
    if ok:
        partial.check(doc, schema, partial.parse(spec))
    else:
        with pytest.raises(partial.FieldsError, match="Invalid field selection"):
            partial.check(doc, schema, partial.parse(spec))


def test_a_node_list_with_fields_sends_only_those_fields(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    for node_id in ("f1", "f2"):
        tpu.create_node(parent=parent(lc), node_id=node_id, node=v6e(labels={"run": "r1"})).result(timeout=10)
    url = f"{lc.api_endpoint}/v2/{parent(lc)}/nodes"
    full = requests.get(url, timeout=5).json()["nodes"]
    assert {"acceleratorType", "networkEndpoints", "labels"} <= full[0].keys()
    got = requests.get(url, params={"fields": "nodes(name,state),nextPageToken"}, timeout=5)
    assert got.status_code == 200
    assert got.json() == {"nodes": [{"name": n["name"], "state": n["state"]} for n in full]}


def test_an_unknown_or_malformed_selection_is_a_400(lc: RunningLocalCloud) -> None:
    url = f"{lc.api_endpoint}/v2/{parent(lc)}/nodes"
    for spec in ("nodes(name,stat)", "nodes(name"):
        r = requests.get(url, params={"fields": spec}, timeout=5)
        assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", spec
    vms = f"{lc.api_endpoint}/compute/v1/projects/{lc.project}/zones/{ZONE}/instances"
    assert requests.get(vms, params={"fields": "items(name,state)"}, timeout=5).status_code == 400
    assert requests.get(vms, params={"fields": "items(name,status),nextPageToken"}, timeout=5).status_code == 200


def test_a_malformed_selection_is_refused_before_the_call_acts(lc: RunningLocalCloud, tpu: tpu_v2.TpuClient) -> None:
    r = requests.post(
        f"{lc.api_endpoint}/v2/{parent(lc)}/nodes",
        params={"nodeId": "never", "fields": "name("},
        json={"acceleratorType": "v6e-8", "runtimeVersion": "v2-alpha-tpuv6e"},
        timeout=5,
    )
    assert r.status_code == 400
    assert [n.name for n in tpu.list_nodes(parent=parent(lc))] == []
