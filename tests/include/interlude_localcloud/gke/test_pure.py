"""The pure parts of the Kubernetes API: selectors, patch semantics, server-side apply ownership, and the
store's resourceVersion / watch rules. No server: plain data in, data out."""

from __future__ import annotations

import pytest

from interlude_localcloud.gke import patching, selectors
from interlude_localcloud.gke.resources import find
from interlude_localcloud.gke.status import KubeError
from interlude_localcloud.gke.store import Store, WatchEvent
from interlude_localcloud.gke.validation import Admission

DEPLOY = find("apps", "v1", "deployments")
NAMESPACES = find("", "v1", "namespaces")
assert DEPLOY is not None and NAMESPACES is not None


def _obj(labels: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"labels": labels}}


@pytest.mark.parametrize(
    ("selector", "labels", "match"),
    [
        ("app=vllm", {"app": "vllm"}, True),
        ("app==vllm", {"app": "tgi"}, False),
        ("app!=vllm", {}, True),
        ("app in (vllm, tgi),tier", {"app": "tgi", "tier": "x"}, True),
        ("app in (vllm, tgi),tier", {"app": "tgi"}, False),
        ("app notin (vllm)", {"app": "tgi"}, True),
        ("!canary", {"canary": "1"}, False),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], match: bool) -> None:
    assert selectors.label_selector(selector)(_obj(labels)) is match


def test_bad_selector_is_a_400() -> None:
    with pytest.raises(KubeError) as e:
        selectors.label_selector("app in vllm")
    assert e.value.code == 400


def test_field_selector() -> None:
    pred = selectors.field_selector("metadata.name=a,spec.nodeName!=n1")
    assert pred({"metadata": {"name": "a"}, "spec": {"nodeName": "n2"}})
    assert not pred({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}})


def test_merge_patch_rfc7386() -> None:
    assert patching.merge_patch({"a": {"b": 1, "c": 2}, "l": [1, 2]}, {"a": {"b": None, "d": 3}, "l": [3]}) == {
        "a": {"c": 2, "d": 3},
        "l": [3],
    }


def test_strategic_merge_by_key_and_directives() -> None:
    cur = {
        "containers": [{"name": "a", "image": "1", "ports": [{"containerPort": 80}]}, {"name": "b", "image": "1"}],
        "tolerations": [{"key": "x"}],
    }
    out = patching.strategic_merge(
        cur,
        {
            "containers": [{"name": "a", "image": "2"}, {"name": "b", "$patch": "delete"}, {"name": "c", "image": "3"}],
            "tolerations": [{"key": "y"}],
        },
    )
    assert out["containers"] == [
        {"name": "a", "image": "2", "ports": [{"containerPort": 80}]},
        {"name": "c", "image": "3"},
    ]
    assert out["tolerations"] == [{"key": "y"}]  # no merge key: the list is replaced


def test_json_patch_ops_and_failed_test() -> None:
    doc = {"a": [1, 2], "b": {"c": 1}}
    assert patching.json_patch(
        doc,
        [
            {"op": "add", "path": "/a/-", "value": 3},
            {"op": "remove", "path": "/b/c"},
            {"op": "copy", "from": "/a/0", "path": "/d"},
        ],
    ) == {"a": [1, 2, 3], "b": {}, "d": 1}
    with pytest.raises(KubeError) as e:
        patching.json_patch(doc, [{"op": "test", "path": "/b/c", "value": 2}])
    assert e.value.code == 400 and doc == {"a": [1, 2], "b": {"c": 1}}


def test_server_side_apply_ownership() -> None:
    first = patching.server_side_apply(None, {"spec": {"replicas": 1, "paused": False}}, "a", False, "apps/v1")
    assert [m["manager"] for m in first["metadata"]["managedFields"]] == ["a"]
    with pytest.raises(KubeError) as e:  # b wants a different value for a field a owns
        patching.server_side_apply(first, {"spec": {"replicas": 2}}, "b", False, "apps/v1")
    assert e.value.code == 409 and e.value.details and e.value.details["causes"][0]["field"] == ".spec.replicas"
    same = patching.server_side_apply(first, {"spec": {"replicas": 1}}, "b", False, "apps/v1")  # same value: shared
    assert {m["manager"] for m in same["metadata"]["managedFields"]} == {"a", "b"}
    forced = patching.server_side_apply(first, {"spec": {"replicas": 2}}, "b", True, "apps/v1")
    owners = {m["manager"]: patching.from_fields_v1(m["fieldsV1"]) for m in forced["metadata"]["managedFields"]}
    assert ("f:spec", "f:replicas") in owners["b"] and ("f:spec", "f:replicas") not in owners["a"]
    dropped = patching.server_side_apply(forced, {"spec": {}}, "a", False, "apps/v1")  # a stops applying paused
    assert dropped["spec"] == {"replicas": 2}


def _store() -> tuple[Store, list[WatchEvent]]:
    store = Store(Admission("1.33"))
    store.create(NAMESPACES, "", {"metadata": {"name": "ns"}})
    return store, []


def _dep(name: str, replicas: int = 1) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def test_store_resource_versions_conflicts_and_watch_replay() -> None:
    store, seen = _store()
    created = store.create(DEPLOY, "ns", _dep("d"))
    rv0 = int(created["metadata"]["resourceVersion"])
    updated = store.update(DEPLOY, "ns", "d", lambda o: {**o, "spec": {**o["spec"], "replicas": 2}})
    assert int(updated["metadata"]["resourceVersion"]) == rv0 + 1 and updated["metadata"]["generation"] == 2
    with pytest.raises(KubeError) as e:  # stale resourceVersion
        store.update(DEPLOY, "ns", "d", lambda o: {**o, "metadata": {**o["metadata"], "resourceVersion": str(rv0)}})
    assert e.value.code == 409 and e.value.reason == "Conflict"
    with pytest.raises(KubeError) as e:  # an invalid write is never stored
        store.update(DEPLOY, "ns", "d", lambda o: {**o, "spec": {**o["spec"], "selector": {}}})
    assert e.value.code == 422
    first, unsubscribe = store.watch(DEPLOY, "ns", str(rv0), seen.append)
    assert [(ev.type, ev.object["spec"]["replicas"]) for ev in first] == [("MODIFIED", 2)]
    store.delete(DEPLOY, "ns", "d")
    unsubscribe()
    store.create(DEPLOY, "ns", _dep("late"))
    assert [ev.type for ev in seen] == ["DELETED"]
    synthetic, unsubscribe = store.watch(DEPLOY, None, None, seen.append)
    unsubscribe()
    assert [(ev.type, ev.object["metadata"]["name"]) for ev in synthetic] == [("ADDED", "late")]


def test_namespace_must_exist_and_names_are_unique() -> None:
    store, _ = _store()
    with pytest.raises(KubeError) as e:
        store.create(DEPLOY, "missing", _dep("d"))
    assert e.value.code == 404
    store.create(DEPLOY, "ns", _dep("d"))
    with pytest.raises(KubeError) as e:
        store.create(DEPLOY, "ns", _dep("d"))
    assert e.value.code == 409 and e.value.reason == "AlreadyExists"


def test_the_policy_guides_compute_class_passes_admission_and_parses_back() -> None:
    """The ComputeClass the policy tests model (Google's TPU/GPU guide) is one this API server stores."""
    from interlude_localcloud.gke.policy.compute_class import ComputeClass
    from tests.include.interlude_localcloud.gke.policy.guide import class_manifest

    cc_type = find("cloud.google.com", "v1", "computeclasses")
    assert cc_type is not None
    manifest = class_manifest(
        whenUnsatisfiable="ScaleUpAnyway",
        nodePoolAutoCreation={"enabled": False},
        autoscalingPolicy={"consolidationDelayMinutes": 5},
        activeMigration={"optimizeRulePriority": True},
    )
    store = Store(Admission("1.33"))
    stored = store.create(cc_type, "", manifest)
    assert ComputeClass.from_manifest(stored).name == manifest["metadata"]["name"]
