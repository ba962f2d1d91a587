"""The queued resource trigger's one decision per observation, over every state Google documents."""

from __future__ import annotations

import pytest

from interlude.triggers.provision import verdict

STATES = [
    "CREATING",
    "ACCEPTED",
    "PROVISIONING",
    "FAILED",
    "DELETING",
    "ACTIVE",
    "SUSPENDING",
    "SUSPENDED",
    "WAITING_FOR_RESOURCES",
    "STATE_UNSPECIFIED",
]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize("node_state", [None, "CREATING", "READY"])
@pytest.mark.parametrize("late", [False, True])
def test_verdict(state: str, node_state: str | None, late: bool) -> None:
    node = {"name": "n", "state": node_state} if node_state else None
    event = verdict({"state": {"state": state}}, node, now=2.0 if late else 0.0, deadline=1.0)
    if state in ("FAILED", "SUSPENDING", "SUSPENDED"):
        assert event is not None and event["status"] == "error"
    elif state == "ACTIVE" and node_state == "READY":
        assert event == {"status": "ready", "node": "n"}
    elif late:
        assert event is not None and event["status"] == "error" and "deadline" in event["message"]
    else:
        assert event is None


def test_a_vanished_queued_resource_is_an_error() -> None:
    assert verdict(None, None, 0.0, 1.0) == {"status": "error", "message": "the queued resource is gone"}
