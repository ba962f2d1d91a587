"""The serving pods as the Kubernetes API records them, for the report: every change (a watch from a
resourceVersion, resumed where it stopped) and every request each replica answered (its access log, followed
from the moment the pod runs until its container ends). Runs beside the maintenance watch, in the triggerer.

Why follow and not read now and then: a pod's log goes with the pod, so a reader that reads it at intervals
loses what a pod answered after its last read (the HPA's scale-down, an eviction). A `follow` stream opened
while the pod lives ends only when its container does
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#get-read-log-of-the-specified-pod).
What the observer could not see it records: a 410 Gone resume (changes lost in between) and pods it could not
open a log for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from kubernetes_asyncio import client as async_client

from interlude.serving.loadgen import served_completions
from interlude.serving.observe import accelerator_of
from interlude.serving.observed import PodChange, Served, pod_change

#: A watch request's server-side timeout (seconds): the watch is resumed from the last resourceVersion after it.
WATCH_SECONDS = 300
#: Changes kept for the report (an XCom stays small); beyond, the report says the timeline was cut.
MAX_CHANGES = 5000


class PodObserver:
    """Watch the serving pods from `since` (a resourceVersion; "" = from now) and follow each running pod's log."""

    def __init__(self, core: async_client.CoreV1Api, namespace: str, selector: str, since: str) -> None:
        self.core: Any = core  # raw answers (_preload_content=False): aiohttp responses, not the typed models
        self.ns, self.selector, self.rv = namespace, selector, since
        self.changes: list[PodChange] = []
        self.gaps: list[str] = []
        self.nodes: dict[str, str | None] = {}
        self._last: dict[str, tuple[str | None, str, bool]] = {}
        self._logs: dict[tuple[str, str], Served] = {}  # (pod, container) -> answered so far
        self._ended: set[str] = set()  # pods whose log streams all ended (the pod went): their count is final
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> PodObserver:
        self._task = asyncio.create_task(self._watch_forever())
        return self

    async def stop(self) -> dict[str, Any]:
        """Stop watching; followers of pods still alive stop too (their count is the log so far)."""
        for task in [self._task, *self._followers.values()]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        served: dict[str, Served] = {}
        for (pod, _container), count in self._logs.items():
            best = served.get(pod, Served(0, 0))
            served[pod] = count if count.ok + count.failed > best.ok + best.failed else best
        return {
            "rv": self.rv,
            "changes": [c.to_dict() for c in self.changes],
            "served": {pod: [s.ok, s.failed] for pod, s in served.items()},
            "ended": sorted(self._ended),
            "gaps": self.gaps,
            "nodes": self.nodes,
        }

    async def _watch_forever(self) -> None:
        try:
            while True:
                try:
                    await self._watch_once()
                except async_client.ApiException as exc:
                    if exc.status != 410:
                        raise
                    await self._relist(f"watch from resourceVersion {self.rv} answered 410 Gone")
        except Exception as exc:  # noqa: BLE001 - the report names it; the maintenance watch goes on
            self.gaps.append(f"pod watch stopped at resourceVersion {self.rv}: {type(exc).__name__}: {exc}"[:300])

    async def _watch_once(self) -> None:
        resp = await self.core.list_namespaced_pod(
            self.ns,
            label_selector=self.selector,
            watch=True,
            resource_version=self.rv or None,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
        )
        async with resp:
            if resp.status >= 400:
                raise async_client.ApiException(status=resp.status, reason=(await resp.read())[:300].decode())
            async for raw in resp.content:
                if raw.strip():
                    await self._event(json.loads(raw))

    async def _event(self, event: dict[str, Any]) -> None:
        if event.get("type") == "ERROR":
            code = int((event.get("object") or {}).get("code") or 500)
            raise async_client.ApiException(status=code, reason=str(event.get("object"))[:300])
        if event.get("type") == "BOOKMARK":
            self.rv = str(event["object"]["metadata"]["resourceVersion"])
            return
        await self._record(pod_change(str(event.get("type")), event["object"], time.time()), event["object"])

    async def _relist(self, why: str) -> None:
        """After a 410: the pods as they are now (what changed in between is lost, and said so)."""
        listed = await self.core.list_namespaced_pod(self.ns, label_selector=self.selector, _preload_content=False)
        body = json.loads(await listed.read())
        self.gaps.append(f"{why}: pod changes before resourceVersion {body['metadata']['resourceVersion']} lost")
        self.rv = str(body["metadata"]["resourceVersion"])
        for pod in body.get("items") or []:
            await self._record(pod_change("MODIFIED", pod, time.time()), pod)

    async def _record(self, change: PodChange, pod: dict[str, Any]) -> None:
        self.rv = str(max(int(self.rv or 0), change.rv))
        if self._last.get(change.name) != change.key() and len(self.changes) < MAX_CHANGES:
            self.changes.append(change)
        if len(self.changes) >= MAX_CHANGES and "changes cut" not in " ".join(self.gaps):
            self.gaps.append(f"changes cut at {MAX_CHANGES}: later pod changes not in the timeline")
        self._last[change.name] = change.key()
        if change.node and change.node not in self.nodes:
            self.nodes[change.node] = await self._node_kind(change.node)
        if change.phase == "Running" and change.name not in self._followers:
            containers = [c["name"] for c in (pod.get("spec") or {}).get("containers") or []]
            self._followers[change.name] = asyncio.create_task(self._follow_pod(change.name, containers))

    async def _node_kind(self, node: str) -> str | None:
        try:
            resp = await self.core.read_node(node, _preload_content=False)
            body = json.loads(await resp.read()) if resp.status < 400 else {}
        except async_client.ApiException:
            return None
        return accelerator_of(((body.get("metadata") or {}).get("labels")) or {})

    async def _follow_pod(self, pod: str, containers: list[str]) -> None:
        done = await asyncio.gather(*(self._follow(pod, c) for c in containers))
        if all(done):
            self._ended.add(pod)

    async def _follow(self, pod: str, container: str) -> bool:
        """Count the container's access lines until its log ends (True) or it cannot be read (False)."""
        try:
            resp = await self.core.read_namespaced_pod_log(
                pod, self.ns, container=container, follow=True, _preload_content=False
            )
        except async_client.ApiException:
            return False
        async with resp:
            if resp.status >= 400:
                return False
            self._logs[(pod, container)] = Served(0, 0)
            async for raw in resp.content:
                ok, failed = served_completions(raw.decode(errors="replace"))
                if ok or failed:
                    seen = self._logs[(pod, container)]
                    self._logs[(pod, container)] = Served(seen.ok + ok, seen.failed + failed)
        return True
