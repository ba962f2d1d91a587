"""Two model exports per session (fresh JAX models, seeds 1 and 2), written and verified by the workload's own
`export_hf` once; each test uploads what it needs to its own bucket."""

from __future__ import annotations

from pathlib import Path

import pytest

from .standin_proc import make_export


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("exports")
    return {seed: make_export(root / f"seed-{seed}", seed) for seed in (1, 2)}
