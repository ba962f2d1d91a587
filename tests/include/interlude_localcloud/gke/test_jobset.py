"""JobSets on the local GKE, driven by the real `kubernetes` client: child Jobs and pods as the JobSet and Job
controllers make them, pods running as processes on TPU nodes, restarts, deletion and node maintenance.
One cluster (two v6e 2x2 nodes) for the module; pods are short python processes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from interlude.hooks.gke import GKEHook
from interlude_localcloud.scenario import parse
from interlude_localcloud.testing import RunningLocalCloud, running_localcloud

LOCATION, CLUSTER, NS = "us-central1", "training", "train"
JS = {"group": "jobset.x-k8s.io", "version": "v1alpha2", "plural": "jobsets"}
IMAGE = "us-docker.pkg.dev/interlude/trainer:1"
SCENARIO: dict[str, Any] = {
    "project": "jobset-proj",
    "time_scale": 3600,
    "gke": {
        "run": True,
        "images": {"*/trainer:*": {"python3": ["{python}"], "python": ["{python}"]}},
        "clusters": [
            {
                "name": CLUSTER,
                "location": LOCATION,
                "kubernetes_version": "1.33.5-gke.1080000",
                "node_pools": [
                    {
                        "name": "v6e",
                        "machine_type": "ct6e-standard-4t",
                        "tpu": {"accelerator": "tpu-v6e-slice", "topology": "2x2", "chips": 4},
                        "min_nodes": 2,
                        "max_nodes": 2,
                        "initial_nodes": 2,
                        "zones": ["us-central1-b"],
                    }
                ],
            }
        ],
    },
}
# A trainer: says who it is (from the env JobSet/Job give it), fails once when asked, and reports SIGTERM.
TRAINER = """
import os, signal, sys, time
attempt = os.environ["ATTEMPT"]
print(f"trainer index={os.environ['JOB_COMPLETION_INDEX']} attempt={attempt} host={os.environ['HOSTNAME']}", flush=True)
def term(*_):
    print("got SIGTERM, saving", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
if os.environ.get("FAIL_ATTEMPT") == attempt:
    sys.exit(3)
end = time.monotonic() + float(os.environ.get("RUN_SECONDS", "0"))
while time.monotonic() < end:
    time.sleep(0.05)
print("trainer done", flush=True)
"""
DEADLINE = 60.0


def wait_for(what: str, check: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def lc() -> Iterator[RunningLocalCloud]:
    with running_localcloud(parse(SCENARIO), gcs=False, strict=True) as cloud:
        yield cloud
        assert cloud.violations == []


@pytest.fixture(scope="module")
def api(lc: RunningLocalCloud) -> Iterator[client.ApiClient]:
    env = lc.airflow_conn_env("interlude_jobset_test")
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    hook = GKEHook(gcp_conn_id="interlude_jobset_test", location=LOCATION)
    with hook.kubernetes_hook(CLUSTER, project_id=lc.project).get_conn() as api_client:
        client.CoreV1Api(api_client).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        yield api_client
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def jobset(
    name: str, replicas: int = 2, env: dict[str, str] | None = None, max_restarts: int | None = None, **pod: Any
) -> dict[str, Any]:
    """A JobSet as xpk/MaxText render one for a v6e 2x2 slice: one pod per host, TPU node selector."""
    attempt = {"fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/restart-attempt']"}}
    spec: dict[str, Any] = {
        "replicatedJobs": [
            {
                "name": "slice",
                "replicas": replicas,
                "template": {
                    "spec": {
                        "parallelism": 1,
                        "completions": 1,
                        "backoffLimit": 0,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "terminationGracePeriodSeconds": 5,
                                "nodeSelector": {
                                    "cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                    "cloud.google.com/gke-tpu-topology": "2x2",
                                },
                                "tolerations": [
                                    {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
                                ],
                                "containers": [
                                    {
                                        "name": "trainer",
                                        "image": IMAGE,
                                        "command": ["python3", "-c", TRAINER],
                                        "env": [
                                            {"name": "ATTEMPT", "valueFrom": attempt},
                                            *({"name": k, "value": v} for k, v in (env or {}).items()),
                                        ],
                                        "resources": {"limits": {"google.com/tpu": 4}},
                                    }
                                ],
                                **pod,
                            }
                        },
                    }
                },
            }
        ]
    }
    if max_restarts is not None:
        spec["failurePolicy"] = {"maxRestarts": max_restarts}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": name}, "spec": spec}


def _status(api: client.ApiClient, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(**JS, namespace=NS, name=name).get("status") or {}


def _condition(api: client.ApiClient, name: str, ctype: str) -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for c in _status(api, name).get("conditions") or [])


def _pods(api: client.ApiClient, name: str) -> list[client.V1Pod]:
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"
    return list(client.CoreV1Api(api).list_namespaced_pod(NS, label_selector=sel).items)


def _log(api: client.ApiClient, pod: str) -> str:
    return str(client.CoreV1Api(api).read_namespaced_pod_log(pod, NS))


def test_a_jobset_runs_its_replicated_jobs_pods_to_completion(api: client.ApiClient) -> None:
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    created = custom.create_namespaced_custom_object(**JS, namespace=NS, body=jobset("train"))
    assert created["spec"]["network"]["enableDNSHostnames"] is True  # the webhook's defaults
    wait_for("JobSet Completed", lambda: _condition(api, "train", "Completed"))
    jobs = {j.metadata.name: j for j in batch.list_namespaced_job(NS).items if j.metadata.name.startswith("train-")}
    assert sorted(jobs) == ["train-slice-0", "train-slice-1"]
    job = jobs["train-slice-1"]
    assert job.metadata.labels["jobset.sigs.k8s.io/job-index"] == "1"
    assert job.metadata.labels["jobset.sigs.k8s.io/global-replicas"] == "2"
    assert job.metadata.annotations["jobset.sigs.k8s.io/replicatedjob-name"] == "slice"
    owner = job.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller, owner.block_owner_deletion) == ("JobSet", "train", True, True)
    assert any(c.type == "Complete" and c.status == "True" for c in job.status.conditions)
    assert job.status.succeeded == 1 and job.status.completed_indexes == "0"
    svc = client.CoreV1Api(api).read_namespaced_service("train", NS)  # the headless Service of the subdomain
    assert svc.spec.cluster_ip == "None" and svc.spec.selector == {"jobset.sigs.k8s.io/jobset-name": "train"}
    pods = _pods(api, "train")
    assert len(pods) == 2 and {p.status.phase for p in pods} == {"Succeeded"}
    assert {p.spec.node_name for p in pods} == {n.metadata.name for n in client.CoreV1Api(api).list_node().items}
    for p in pods:
        assert p.metadata.labels["batch.kubernetes.io/job-name"] == p.metadata.labels["job-name"]
        assert p.metadata.labels["batch.kubernetes.io/job-completion-index"] == "0"
        assert p.spec.subdomain == "train"
        out = _log(api, p.metadata.name)
        assert f"trainer index=0 attempt=0 host={p.metadata.labels['job-name']}-0" in out, out
        assert "trainer done" in out
        assert p.status.container_statuses[0].state.terminated.exit_code == 0
    assert _status(api, "train")["terminalState"] == "Completed"


def test_a_failing_pod_makes_the_jobset_recreate_all_its_jobs(api: client.ApiClient) -> None:
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    custom.create_namespaced_custom_object(
        **JS, namespace=NS, body=jobset("flaky", env={"FAIL_ATTEMPT": "0"}, max_restarts=2)
    )
    wait_for("JobSet Completed", lambda: _condition(api, "flaky", "Completed"))
    st = _status(api, "flaky")
    # One restart for the failed attempt 0. A full suite's load once failed an attempt-1 pod as well (restarts 2,
    # the JobSet still Completed within maxRestarts): each restart is then one more attempt, all Jobs recreated.
    restarts = st["restarts"]
    assert 1 <= restarts <= 2 and st["restartsCountTowardsMax"] == restarts, st
    jobs = [j for j in batch.list_namespaced_job(NS).items if j.metadata.name.startswith("flaky-")]
    assert sorted(j.metadata.name for j in jobs) == ["flaky-slice-0", "flaky-slice-1"]
    assert {j.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] for j in jobs} == {str(restarts)}, st
    pods = _pods(api, "flaky")  # the earlier attempts' pods went with their Jobs
    assert len(pods) == 2 and {p.status.phase for p in pods} == {"Succeeded"}
    for p in pods:
        assert f"attempt={restarts}" in _log(api, p.metadata.name), (st, _log(api, p.metadata.name))


@pytest.mark.parametrize("policy", ["Foreground", "Background"])
def test_deleting_a_jobset_removes_its_jobs_and_pods(api: client.ApiClient, policy: str) -> None:
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    name = f"gone-{policy.lower()}"
    custom.create_namespaced_custom_object(**JS, namespace=NS, body=jobset(name, env={"RUN_SECONDS": "600"}))
    wait_for("pods running", lambda: [p for p in _pods(api, name) if p.status.phase == "Running"])
    custom.delete_namespaced_custom_object(
        **JS, namespace=NS, name=name, body=client.V1DeleteOptions(propagation_policy=policy)
    )
    sel = f"jobset.sigs.k8s.io/jobset-name={name}"
    wait_for("Jobs gone", lambda: not batch.list_namespaced_job(NS, label_selector=sel).items)
    wait_for("pods gone", lambda: not _pods(api, name))
    wait_for(
        "JobSet gone",
        lambda: (
            not [
                o
                for o in custom.list_namespaced_custom_object(**JS, namespace=NS)["items"]
                if o["metadata"]["name"] == name
            ]
        ),
    )


def test_node_maintenance_terminates_the_pod_and_it_comes_back_on_the_node(
    lc: RunningLocalCloud, api: client.ApiClient
) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    node = core.list_node().items[0].metadata.name
    body = jobset(
        "maint",
        replicas=1,
        env={"RUN_SECONDS": "600"},
        max_restarts=3,
        **{"nodeSelector": {"kubernetes.io/hostname": node}},
    )
    custom.create_namespaced_custom_object(**JS, namespace=NS, body=body)
    first = wait_for("pod running", lambda: [p for p in _pods(api, "maint") if p.status.phase == "Running"])[0]
    wait_for("trainer started", lambda: "trainer index=0" in _log(api, first.metadata.name))
    asked_at = time.time()
    window = lc.admin.gke_node_maintenance_window(
        CLUSTER, node, notice_in=0, window_in=30 * 24 * 3600, duration_seconds=600
    )
    labels = wait_for(
        "the notice", lambda: core.read_node(node).metadata.labels.get("cloud.google.com/scheduled-maintenance-time")
    )
    assert int(labels) == int(window["window_start_epoch"])  # Unix epoch seconds of the wall clock, as on Google
    # ... placed 30 scenario days (720 s here) after a moment between the ask and now (the label is whole seconds)
    placed_from = int(labels) - 30 * 24 * 3600 / SCENARIO["time_scale"]
    assert asked_at <= placed_from + 1 and placed_from <= time.time(), (asked_at, labels)
    assert not any(
        t.key == "cloud.google.com/impending-node-termination" for t in core.read_node(node).spec.taints or []
    )
    core.patch_node(node, {"metadata": {"labels": {"cloud.google.com/perform-maintenance": "true"}}})  # start now
    log_file = next((lc.state_dir / "gke" / CLUSTER / "pods").glob(f"{first.metadata.name}-*")) / "trainer.log"
    wait_for("SIGTERM seen by the trainer", lambda: "got SIGTERM, saving" in log_file.read_text())
    second = wait_for(
        "a new pod running on the node once it is back",
        lambda: [
            p for p in _pods(api, "maint") if p.status.phase == "Running" and p.metadata.uid != first.metadata.uid
        ],
    )[0]
    assert second.spec.node_name == node
    phases = {e.get("phase") for e in lc.admin.gke_events(CLUSTER)["events"] if e.get("node") == node}
    assert {"scheduled", "terminating", "done"} <= phases  # labelled, then tainted and drained, then back
    back = core.read_node(node)
    assert "cloud.google.com/scheduled-maintenance-time" not in back.metadata.labels
    assert not any(t.key == "cloud.google.com/impending-node-termination" for t in back.spec.taints or [])
    assert _status(api, "maint")["restarts"] == 1
    wait_for("the new trainer", lambda: "attempt=1" in _log(api, second.metadata.name))
    custom.delete_namespaced_custom_object(**JS, namespace=NS, name="maint")


def test_jobs_and_jobsets_are_discovered_schema_checked_and_watched(api: client.ApiClient) -> None:
    groups = {g.name: g for g in client.ApisApi(api).get_api_versions().groups}
    assert groups["jobset.x-k8s.io"].preferred_version.group_version == "jobset.x-k8s.io/v1alpha2"
    found = client.CustomObjectsApi(api).get_api_resources("jobset.x-k8s.io", "v1alpha2").resources
    assert {r.name for r in found} == {"jobsets", "jobsets/status"}
    assert "jobs" in {r.name for r in client.BatchV1Api(api).get_api_resources().resources}
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    bad = jobset("bad")
    bad["spec"]["replicatedJobs"][0]["replicas"] = "two"  # the CRD says integer
    with pytest.raises(client.ApiException) as e:
        custom.create_namespaced_custom_object(**JS, namespace=NS, body=bad)
    assert e.value.status == 422 and "spec.replicatedJobs[0].replicas" in str(e.value.body)
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="always"),
        spec=client.V1JobSpec(
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(restart_policy="Always", containers=[client.V1Container(name="c", image=IMAGE)])
            )
        ),
    )
    with pytest.raises(client.ApiException) as e:
        batch.create_namespaced_job(NS, job)
    assert e.value.status == 422 and "spec.template.spec.restartPolicy" in str(e.value.body)
    rv = custom.list_namespaced_custom_object(**JS, namespace=NS)["metadata"]["resourceVersion"]
    custom.create_namespaced_custom_object(**JS, namespace=NS, body=jobset("watched", replicas=1))
    seen: list[tuple[str, str]] = []
    w = watch.Watch()
    for ev in w.stream(
        custom.list_namespaced_custom_object, **JS, namespace=NS, resource_version=rv, timeout_seconds=DEADLINE
    ):
        seen.append((ev["type"], ev["object"]["metadata"]["name"]))
        if any(c["type"] == "Completed" for c in (ev["object"].get("status") or {}).get("conditions") or []):
            w.stop()
    assert seen[0] == ("ADDED", "watched") and seen[-1][0] == "MODIFIED"
    status = custom.get_namespaced_custom_object_status(**JS, namespace=NS, name="watched")["status"]
    assert status["replicatedJobsStatus"][0]["name"] == "slice" and status["terminalState"] == "Completed"


@pytest.mark.processes  # the Job's pod runs the workload's agent (tests/quick.py)
def test_a_plain_job_runs_the_workload_agent_entrypoint_to_its_completions(api: client.ApiClient) -> None:
    """batch/v1 directly (NonIndexed, 2 completions one at a time): the trainer image's `python` is the
    local interpreter, so the workload's agent entrypoint runs in the pod (here only its --help)."""
    batch = client.BatchV1Api(api)
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name="agent-help"),
        spec=client.V1JobSpec(
            completions=2,
            parallelism=1,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    tolerations=[client.V1Toleration(key="google.com/tpu", operator="Exists", effect="NoSchedule")],
                    containers=[
                        client.V1Container(
                            name="agent", image=IMAGE, command=["python", "-m", "interlude_workload.agent", "--help"]
                        )
                    ],
                )
            ),
        ),
    )
    created = batch.create_namespaced_job(NS, job)
    assert created.spec.backoff_limit == 6 and created.spec.completion_mode == "NonIndexed"
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": created.metadata.uid}
    assert created.spec.template.metadata.labels["batch.kubernetes.io/job-name"] == "agent-help"
    done = wait_for(
        "Job Complete",
        lambda: (
            (j := batch.read_namespaced_job("agent-help", NS)).status.conditions
            and any(c.type == "Complete" for c in j.status.conditions)
            and j
        ),
    )
    assert done.status.succeeded == 2 and not done.status.failed
    uid = done.metadata.uid
    assert done.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    pods = (
        client.CoreV1Api(api).list_namespaced_pod(NS, label_selector=f"batch.kubernetes.io/controller-uid={uid}").items
    )
    assert len(pods) == 2 and all("batch.kubernetes.io/job-completion-index" not in p.metadata.labels for p in pods)
    for p in pods:
        assert "--run-key RUN_KEY" in _log(api, p.metadata.name)
    batch.delete_namespaced_job("agent-help", NS, propagation_policy="Background")
    wait_for(
        "pods gone",
        lambda: not client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="job-name=agent-help").items,
    )
