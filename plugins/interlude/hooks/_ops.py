"""Helpers shared by the TPU and Compute hooks: client-call wrapping, polling, proto <-> dict.

Every google-cloud-* client call goes through :func:`client_call` so a 429/503 is retried with the same
bounded backoff as our raw REST calls and every Google error becomes one of our exception classes.
Long-running operations are polled by our own code (never the library's ``result()``), because the
Compute library polls the public endpoint regardless of ``client_options`` and because our polling
survives 503 bursts with the same retries.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

import requests
from google.api_core.exceptions import GoogleAPICallError
from google.protobuf.json_format import ParseError

from interlude.hooks._retry import RetryPolicy, call_with_retries
from interlude.hooks.errors import CloudError, InvalidRequestError, TransientError, error_from_api_core

T = TypeVar("T")
M = TypeVar("M")

log = logging.getLogger(__name__)

#: Timeout (seconds) of each single client HTTP call.
CALL_TIMEOUT = 60.0


def client_call(fn: Callable[[], T], policy: RetryPolicy, what: str) -> T:
    """Run a google-cloud-* client call with our retries; map its exceptions to ours."""

    def once() -> T:
        try:
            return fn()
        except GoogleAPICallError as exc:
            raise error_from_api_core(exc) from exc
        except (requests.ConnectionError, requests.Timeout) as exc:
            raise TransientError(f"{what} failed: {exc}", None, "UNAVAILABLE") from exc

    return call_with_retries(once, policy, what)


def dict_to_message(message_type: type[M], body: dict[str, Any]) -> M:
    """Build a proto-plus request message from a camelCase (or snake_case) JSON body.

    Unknown fields are an error rather than silently dropped: a field the client cannot carry would
    otherwise vanish from the request without anyone noticing.
    """
    try:
        return message_type.from_json(json.dumps(body))  # type: ignore[attr-defined]
    except (ParseError, TypeError, ValueError) as exc:
        raise InvalidRequestError(
            f"{message_type.__name__} body not accepted by the client library: {exc}", 400, "INVALID_ARGUMENT"
        ) from exc


def poll_until(check: Callable[[], T | None], *, timeout: float, max_interval: float, what: str) -> T:
    """Call ``check`` until it returns something other than None; back off from 0.25 s to ``max_interval``.

    Raises ``CloudError(status="DEADLINE_EXCEEDED")`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    interval = 0.25
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() + interval > deadline:
            raise CloudError(f"{what} did not finish within {timeout:.0f}s", 504, "DEADLINE_EXCEEDED")
        time.sleep(interval)
        interval = min(max_interval, interval * 1.6)
