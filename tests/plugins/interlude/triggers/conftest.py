"""Shared by the trigger tests that run against a local cloud of their module (its `cloud` fixture)."""

from __future__ import annotations

import json
from typing import Any

import pytest


@pytest.fixture
def anonymous_connection(cloud: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`google_cloud_default` as an anonymous connection to the module's local cloud (TPU API there)."""
    extra = {"is_anonymous": True, "project": cloud.project, "tpu_endpoint": cloud.api_endpoint}
    monkeypatch.setenv(
        "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({"conn_type": "google_cloud_platform", "extra": extra})
    )
