"""One pretrained reference model for every llm test, computed once per run even across xdist workers.

100 steps on the shipped corpus (a few seconds on 2 cores): enough for greedy completions that are
sentences, not noise, so the export tests compare real answers, and the base the day fine-tune starts from.
Training is deterministic, so the first worker to need it trains and saves the state's arrays next to the
run's temporary directories, and the others load them (under a lock) instead of training it again.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import pytest

PRETRAIN_STEPS = 100


@pytest.fixture(scope="session")
def tok() -> Any:
    from interlude_workload.llm.tokenizer import load_tokenizer

    return load_tokenizer()


@pytest.fixture(scope="session")
def corpus_data(tok: Any) -> Any:
    from interlude_workload.llm import train_step
    from interlude_workload.llm.corpus import load_corpus
    from interlude_workload.llm.tokenizer import encode_text

    return train_step.prepare_data(encode_text(tok, load_corpus()))


@pytest.fixture(scope="session")
def pretrained(corpus_data: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The train state after :data:`PRETRAIN_STEPS` steps from seed 0."""
    import numpy as np

    from interlude_workload.llm import train_step

    # Under xdist each worker's basetemp is <run>/popen-gwN: its parent is this run's, common to all workers and
    # new each run. Without xdist the parent would be shared by every run (stale states): use basetemp itself.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    with open(shared / "llm-pretrained.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = shared / f"llm-pretrained-{PRETRAIN_STEPS}.npz"
        if cached.exists():
            with np.load(cached) as arrays:
                return train_step.state_from_arrays(train_step.abstract_state(), dict(arrays))
        state = train_step.init_state(seed=0)
        for _ in range(PRETRAIN_STEPS):
            state, _loss = train_step.train_step(state, corpus_data)
        np.savez(cached, **train_step.state_arrays(state))
        return state


@pytest.fixture(scope="session")
def export_dir(pretrained: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pretrained model exported (and verified) once; tests that corrupt it work on copies."""
    from interlude_workload.llm import export, train_step
    from interlude_workload.llm.tokenizer import SHIPPED_DIR

    out = tmp_path_factory.mktemp("export") / "hf"
    export.export_hf(pretrained["params"], train_step.DEFAULT_CONFIG, SHIPPED_DIR, out)
    return out
