"""The same cluster through `kubernetes_asyncio` (what deferrable triggers use): the endpoint, CA and
bearer token come from the GKE hook, as the provider's GKEKubernetesAsyncHook builds its client."""

from __future__ import annotations

import asyncio
import os

from kubernetes_asyncio import client, watch

from interlude.hooks.gke import ANONYMOUS_BEARER_TOKEN, GKEHook
from interlude_localcloud.testing import RunningLocalCloud
from tests.include.interlude_localcloud.gke.cluster import CLUSTER, LOCATION


async def _exercise(url: str, ca_file: str, token: str) -> list[tuple[str, str]]:
    config = client.Configuration(host=url)
    config.ssl_ca_cert = ca_file
    async with client.ApiClient(config, header_name="Authorization", header_value=f"Bearer {token}") as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="async-ns")))
        dep = client.V1Deployment(
            metadata=client.V1ObjectMeta(name="vllm-gpu", labels={"app": "vllm-gpu"}),
            spec=client.V1DeploymentSpec(
                replicas=1,
                selector=client.V1LabelSelector(match_labels={"app": "vllm-gpu"}),
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"app": "vllm-gpu"}),
                    spec=client.V1PodSpec(
                        containers=[client.V1Container(name="vllm", image="vllm/vllm-openai:v0.11.1")]
                    ),
                ),
            ),
        )
        created = await apps.create_namespaced_deployment("async-ns", dep)
        events: list[tuple[str, str]] = []

        async def follow() -> None:
            async with watch.Watch() as w:
                async for ev in w.stream(
                    apps.list_namespaced_deployment,
                    "async-ns",
                    timeout_seconds=5,
                    resource_version=created.metadata.resource_version,
                ):
                    events.append((ev["type"], str(ev["object"].spec.replicas)))
                    if ev["type"] == "DELETED":
                        return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.3)
        await apps.patch_namespaced_deployment("vllm-gpu", "async-ns", {"spec": {"replicas": 2}})
        listed = await apps.list_namespaced_deployment("async-ns", label_selector="app=vllm-gpu")
        assert [d.spec.replicas for d in listed.items] == [2]
        await apps.delete_namespaced_deployment("vllm-gpu", "async-ns")
        await asyncio.wait_for(task, timeout=30)
        try:
            await apps.read_namespaced_deployment("vllm-gpu", "async-ns")
        except client.ApiException as e:
            assert e.status == 404
        else:
            raise AssertionError("deleted deployment still readable")
        return events


def test_kubernetes_asyncio_create_watch_patch_delete(gke_lc: RunningLocalCloud, gke_conn: str) -> None:
    access = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).cluster_access(CLUSTER, project_id=gke_lc.project)
    assert access.token == ANONYMOUS_BEARER_TOKEN  # anonymous connection: the fixed dummy bearer token
    ca_file = access.ca_file()
    try:
        events = asyncio.run(_exercise(access.url, ca_file, access.token))
    finally:
        os.unlink(ca_file)
    # MODIFIED events also carry the Deployment controller's status writes (replicas 1 before the patch).
    assert events[-1] == ("DELETED", "2")
    assert {r for k, r in events[:-1] if k == "MODIFIED"} in ({"2"}, {"1", "2"}), events
    assert ("MODIFIED", "2") in events


def test_the_providers_async_kubernetes_hook_lists_pods(gke_lc: RunningLocalCloud, gke_conn: str) -> None:
    """GKEKubernetesAsyncHook (what the provider's triggers use) through our GKEHook: list_pods works."""
    hook = GKEHook(gcp_conn_id=gke_conn, location=LOCATION).kubernetes_async_hook(CLUSTER, project_id=gke_lc.project)

    async def scenario() -> list[str]:
        async with hook.get_conn() as api:
            core = client.CoreV1Api(api)
            await core.create_namespaced_pod(
                "default",
                client.V1Pod(
                    metadata=client.V1ObjectMeta(name="probe", labels={"job-name": "probe"}),
                    spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox:1.36")]),
                ),
            )
        pods = await hook.list_pods(namespace="default", label_selector="job-name=probe")
        return [p.metadata.name for p in pods]

    assert asyncio.run(scenario()) == ["probe"]
