"""Shared fixtures: one real GCS emulator per session, a fresh bucket per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from interlude_workload.testing import GcsEmulator, running_gcs_emulator


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsEmulator]:
    with running_gcs_emulator() as emulator:
        yield emulator


@pytest.fixture
def bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket; STORAGE_EMULATOR_HOST points this process (and children) at the emulator."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.endpoint)
    name = f"b-{uuid.uuid4().hex[:12]}"
    gcs_emulator.create_bucket(name)
    return name
