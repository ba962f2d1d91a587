"""`pods/{name}/log?follow=true`: the pod's output so far, then each new line, until its containers are gone.

Kubernetes keeps a follow stream open until the container terminates, so a reader that opened it before the
pod was deleted gets every line, the ones written during graceful termination too
(https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#get-read-log-of-the-specified-pod).
Here the pod's kubelet marks its log ended (`Store.end_log`) once its processes are gone and their output read;
a pod deleted before any process ran has no output and its stream ends at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from interlude_localcloud.gke.resources import ResourceType
from interlude_localcloud.gke.store import Store

POLL_SECONDS = 0.2
#: A deleted pod whose kubelet never marks its log ended (its runner died) ends its stream after this quiet time.
QUIET_AFTER_DELETE_SECONDS = 30.0


def _line(text: str) -> bytes:
    return (text if text.endswith("\n") else text + "\n").encode()


async def follow(store: Store, rt: ResourceType, namespace: str, name: str, timeout: float) -> AsyncIterator[bytes]:
    """Every line of the pod's log, as it comes, until the log ended or `timeout` (seconds) passed."""
    key = (namespace, name)
    loop = asyncio.get_running_loop()
    deadline, sent, quiet_since = loop.time() + timeout, 0, None
    while loop.time() < deadline:
        with store.lock:
            lines = list(store.logs.get(key, ())[sent:])
            gone = not store.exists(rt, namespace, name)
            ended = key in store.ended_logs or (gone and not store.logs.get(key))
        for text in lines:
            yield _line(text)
        sent += len(lines)
        if gone and ended:
            return
        quiet_since = None if lines or not gone else (quiet_since or loop.time())
        if quiet_since is not None and loop.time() - quiet_since > QUIET_AFTER_DELETE_SECONDS:
            return
        await asyncio.sleep(POLL_SECONDS)
