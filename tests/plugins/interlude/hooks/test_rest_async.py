"""AsyncRestClient on aiohttp against the real local cloud: one connection pool per event loop, closed with the
loop, the same error mapping as the sync client, and no bearer token in what an error says."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import socket
import warnings
from typing import Any
from urllib.parse import urlsplit

import psutil
import pytest

from interlude.hooks._rest import _query
from interlude.hooks._retry import RetryPolicy
from interlude.hooks.errors import NotFoundError, TransientError
from interlude.hooks.tpu import AsyncTpuHook

ZONE = "us-east5-b"
FAST_RETRY = RetryPolicy(max_attempts=4, initial_delay=0.02, max_delay=0.1)


def make_async_hook(lc: Any, endpoint: str | None = None) -> AsyncTpuHook:
    return AsyncTpuHook(None, tpu_endpoint=endpoint or lc.api_endpoint, project_id=lc.project, retry_policy=FAST_RETRY)


def connections_to(endpoint: str) -> int:
    """This process's established TCP connections to the endpoint's port (what the kernel says, not the pool)."""
    port = urlsplit(endpoint).port
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def test_hooks_on_one_loop_share_one_connection_and_it_closes_with_the_loop(localcloud: Any) -> None:
    """Three hooks (three clients) one after the other on one loop reuse one kept-alive connection; when the
    loop ends, the connection is closed without an 'Unclosed client session' warning."""

    async def calls() -> int:
        for _ in range(3):
            hook = make_async_hook(localcloud)
            assert await hook.list_nodes(ZONE) == []
            assert await hook.get_node(ZONE, "absent") is None
        return connections_to(localcloud.api_endpoint)

    gc.collect()  # what earlier tests in this process left behind warns now, not inside the block below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(calls()) == 1
        gc.collect()
    assert connections_to(localcloud.api_endpoint) == 0
    assert not [w for w in caught if "nclosed" in str(w.message)], [str(w.message) for w in caught]


def test_each_loop_gets_its_own_pool(localcloud: Any) -> None:
    """A hook kept across event loops (a trigger runner may start a new one) works on each."""
    hook = make_async_hook(localcloud)
    for _ in range(2):
        assert asyncio.run(hook.list_nodes(ZONE)) == []


def test_errors_map_as_the_sync_client_does(localcloud: Any) -> None:
    """404 -> NotFoundError; a 503 burst longer than the retries -> TransientError; a refused connection ->
    TransientError after the retries."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"

    async def scenario() -> None:
        hook = make_async_hook(localcloud)
        rest = await hook.async_rest()
        with pytest.raises(NotFoundError):
            await rest.request("GET", await hook.url(f"{ZONE}/nodes/absent"))
        localcloud.admin.inject_fault("/nodes", status=503, count=FAST_RETRY.max_attempts)
        with pytest.raises(TransientError):
            await hook.list_nodes(ZONE)
        with pytest.raises(TransientError, match="ClientConnectorError"):
            await make_async_hook(localcloud, closed).list_nodes(ZONE)

    asyncio.run(scenario())


def test_bearer_token_never_reaches_the_logs_or_errors(localcloud: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The async twin of the sync hook's test: the token travels only in the header, whatever fails."""
    from google.oauth2.credentials import Credentials

    secret = "ya29.secret-token-for-the-async-log-test"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    caplog.set_level(logging.DEBUG)

    async def scenario() -> list[TransientError]:
        errors = []
        for endpoint in (localcloud.api_endpoint, closed):
            hook = make_async_hook(localcloud, endpoint)
            # What a real connection loads: a token the client sends in its Authorization header.
            hook._settings = dataclasses.replace(await hook.settings(), credentials=Credentials(token=secret))
            localcloud.admin.inject_fault("/nodes", status=503, count=FAST_RETRY.max_attempts)
            with pytest.raises(TransientError) as info:
                await hook.list_nodes(ZONE)
            errors.append(info.value)
        return errors

    errors = asyncio.run(scenario())
    assert "transient error" in caplog.text
    for error in errors:
        told = f"{error!r} {error} {error.details} {error.__cause__!r} {error.__cause__}"
        assert secret not in told
    assert secret not in caplog.text


@pytest.mark.parametrize(
    ("params", "query"),
    [
        (None, None),
        ({}, None),
        ({"start": 0, "pageToken": "a b/c"}, {"start": "0", "pageToken": "a b/c"}),
        ({"flag": True, "off": False, "none": None}, {"flag": "true", "off": "false", "none": ""}),
        ({"many": [1, True, "x"]}, {"many": ["1", "true", "x"]}),
        ({"ratio": 0.5}, {"ratio": "0.5"}),
    ],
)
def test_query_values_are_written_as_httpx_wrote_them(params: Any, query: Any) -> None:
    assert _query(params) == query
