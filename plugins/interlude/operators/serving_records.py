"""What the serving report is counted from: the cluster's own records, read with the Kubernetes client.

The apply step's "before" snapshot (the serving pods, their list's resourceVersion, what each pod's log already
held) and the report step's reads after it (the pod watch resumed from a resourceVersion, each pod's access log,
each node's accelerator). Apart from both operators so neither imports the other.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from interlude.serving.loadgen import served_completions
from interlude.serving.observe import accelerator_of
from interlude.serving.observed import PodChange, Served, pod_change

if TYPE_CHECKING:  # the client costs ~0.5 CPU-s to import: the tasks pay it, not every parse of the DAG
    from kubernetes import client

#: The report's own resumed watch: the server replays what changed since the resourceVersion at once; this
#: bounds how long it waits for more (seconds).
REPLAY_SECONDS = 2


def selector(name: str) -> str:
    return f"app.kubernetes.io/name={name}"


def read_served(core: client.CoreV1Api, namespace: str, pod: dict[str, Any]) -> Served | None:
    """The pod's access log as it is now (the container that logged the most: only the serving one does);
    None when no container's log could be read (the pod went)."""
    best: Served | None = None
    for container in (pod.get("spec") or {}).get("containers") or []:
        try:
            text = core.read_namespaced_pod_log(pod["metadata"]["name"], namespace, container=container["name"])
        except _api_exception():
            continue
        count = Served(*served_completions(str(text)))
        best = count if best is None or count.ok + count.failed > best.ok + best.failed else best
    return best


def list_pods(core: client.CoreV1Api, namespace: str, name: str) -> tuple[str, list[dict[str, Any]]]:
    """The serving pods as raw JSON, and the resourceVersion of the list."""
    resp = core.list_namespaced_pod(namespace, label_selector=selector(name), _preload_content=False)
    body = json.loads(resp.data)
    return str(body["metadata"]["resourceVersion"]), list(body.get("items") or [])


def snapshot(api_client: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    """Before the apply: the pods (as changes), the list's resourceVersion and what each pod's log held."""
    from kubernetes import client as kube_client

    core = kube_client.CoreV1Api(api_client)
    rv, pods = list_pods(core, namespace, name)
    now = time.time()
    served = {p["metadata"]["name"]: read_served(core, namespace, p) for p in pods}
    return {
        "pods_rv": rv,
        "pods_at_start": [pod_change("ADDED", p, now).to_dict() for p in pods],
        "served_before": {k: [v.ok, v.failed] for k, v in served.items() if v is not None},
    }


def replay(core: client.CoreV1Api, namespace: str, name: str, since: str) -> tuple[list[PodChange], list[str]]:
    """Every pod change after resourceVersion `since`; a note when the API no longer holds it (410 Gone)."""
    from kubernetes import watch

    changes: list[PodChange] = []
    try:
        for event in watch.Watch().stream(
            core.list_namespaced_pod,
            namespace,
            label_selector=selector(name),
            resource_version=since,
            timeout_seconds=REPLAY_SECONDS,
            deserialize=False,
        ):
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                changes.append(pod_change(event["type"], event["object"], time.time()))
    except _api_exception() as exc:
        if exc.status != 410:
            raise
        return changes, [f"pod changes after resourceVersion {since} not counted: the API answered 410 Gone"]
    return changes, []


def node_kinds(core: client.CoreV1Api, known: dict[str, str | None], wanted: set[str]) -> dict[str, str | None]:
    """Accelerator per node: the nodes now, those the watch recorded, and any other pod's node read by name."""
    kinds = dict(known)
    for node in core.list_node().items:
        kinds[node.metadata.name] = accelerator_of(node.metadata.labels or {})
    for node in wanted - set(kinds):
        try:
            kinds[node] = accelerator_of(core.read_node(node).metadata.labels or {})
        except _api_exception():
            kinds[node] = None
    return kinds


def _api_exception() -> type[client.ApiException]:
    """The client's ApiException, imported when a task first needs it (not at parse time)."""
    from kubernetes.client import ApiException

    return ApiException
