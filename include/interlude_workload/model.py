"""The reference trainer's model: :mod:`interlude_workload.llm`'s JAX Llama, its one-pytree state, and XLA's setup.

The state (params, AdamW state, data key, step; :mod:`interlude_workload.llm.train_step`) is what Orbax saves and
restores as is: the SDK's ``state`` item, with no JSON side. Everything a step depends on is in it, so a resumed
run is bit-identical to an uninterrupted one on the same accelerator family.

Two settings are made before JAX starts its backend (importing this module does not start it; the agent imports
the trainer before it forks, :mod:`interlude_workload.warm`):

* XLA's CPU backend single-threaded (``XLA_FLAGS``), so a CPU run's bits do not depend on how a thread pool split
  a matmul (a TPU or GPU run is unaffected by these flags);
* JAX's persistent compilation cache (``jax_compilation_cache_dir``): the step compiles once per machine disk, not
  once per boot. A maintenance restart would otherwise pay the compile again before training resumes (2-5 s for
  this model on a CPU, minutes for a large one on a TPU). ``JAX_COMPILATION_CACHE_DIR`` wins; default
  ``~/.cache/interlude/jax``. Entries are written whatever the compile took
  (https://docs.jax.dev/en/latest/persistent_compilation_cache.html).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_XLA_CPU_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
if "xla_cpu_multi_thread_eigen" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_XLA_CPU_FLAGS}".strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from interlude_workload.distributed import Mesh, local  # noqa: E402
from interlude_workload.llm import train_step as ts  # noqa: E402

State = ts.State
CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
STAGE_SEED_OFFSET = {"train": 0, "finetune": 1}


def compilation_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "interlude" / "jax")


def use_compilation_cache() -> None:
    """Point JAX's persistent cache at :func:`compilation_cache_dir`, keeping every entry (see the module's doc)."""
    directory = compilation_cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return  # a read-only home: compile every time, train all the same
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def new_state(
    stage: str, seed: int, params: Any = None, size: str = ts.DEFAULT_SIZE, mesh: Mesh | None = None
) -> State:
    """A fresh state: new weights from ``seed``, or ``params`` (train's final ones) for a fine-tune, whose
    optimizer starts afresh at the fine-tuning learning rate. With a ``mesh`` (several workers) every worker
    computes it alike and it becomes replicated global arrays."""
    learning_rate = ts.TRAIN_LEARNING_RATE if params is None else ts.FINETUNE_LEARNING_RATE
    chosen = ts.size(size)
    state = ts.init_state(
        chosen.config,
        seed=seed * 16 + STAGE_SEED_OFFSET[stage],
        params=params,
        learning_rate=learning_rate,
        hparams=chosen.hparams,
    )
    return state if mesh is None else mesh.put(state)


def abstract_state(size: str = ts.DEFAULT_SIZE, mesh: Mesh | None = None) -> State:
    """The restore target Orbax needs (shapes, dtypes, shardings), computing nothing; replicated over ``mesh``."""
    chosen = ts.size(size)
    abstract = ts.abstract_state(chosen.config, chosen.hparams)
    if mesh is not None:
        return mesh.abstract(abstract)
    # The sharding named, not left to the checkpoint: a step saved by several workers (a mesh over all their
    # devices) then restores onto this one device too, where Orbax's default (the saved sharding) fails with
    # "Topology mismatch".
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device), abstract)


def mesh_for(size: str) -> Mesh:
    """The data-parallel mesh of every worker's devices for ``size``'s global batch (several workers only)."""
    return Mesh(ts.size(size).hparams.batch_size)


def params_only(restored: Any) -> Any:
    """The weights of a restored state (another stage's), as host arrays."""
    return local(restored["params"])


def step(state: State, data: ts.Data, size: str = ts.DEFAULT_SIZE, mesh: Mesh | None = None) -> tuple[State, float]:
    """One jitted AdamW step (data-parallel over ``mesh``); the loss as a float (which also waits for the step)."""
    chosen = ts.size(size)
    if mesh is None:
        state, loss = ts.train_step(state, data, chosen.config, chosen.hparams)
    else:
        state, loss = ts.sharded_train_step(state, data, chosen.config, chosen.hparams, mesh.rows)
    return state, float(loss)


def digest(state: State) -> str:
    """sha256 of the weights: equal digests, bit-identical weights."""
    return ts.params_digest(local(state["params"]))


def prepare(tokens: np.ndarray, mesh: Mesh | None = None) -> ts.Data:
    data = ts.prepare_data(tokens)
    return data if mesh is None else mesh.put(data)
