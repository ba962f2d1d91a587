"""One training step of the reference model, and the state that makes resume bit-identical.

The whole state is one dict pytree, exactly what an Orbax checkpoint saves and restores as is::

    {"params": ..., "opt_state": ..., "rng": uint32[2], "step": int32[]}

A step depends on nothing else: its batch is drawn from ``fold_in(rng, step)`` (:func:`batch_for`), so
the data position is the step counter and the key never changes; the optimizer (AdamW, gradient
clipping) keeps its moments and count in ``opt_state``, and the learning rate too
(``optax.inject_hyperparams``). Restoring the four leaves therefore resumes a run bit for bit on the
same accelerator family.

One compiled step serves training and fine-tuning: the learning rate is a value in the state, not a
constant in the program, and the token stream is padded to a fixed capacity (:func:`prepare_data`) with
its true length a value too, so both stages lower to the same program and JAX's persistent compilation
cache (``jax_compilation_cache_dir``) hits across stages and processes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from interlude_workload.llm.config import PAD_ID, LlamaConfig
from interlude_workload.llm.model import init_params, loss_fn

State = dict[str, Any]
Data = dict[str, jax.Array]
DATA_CAPACITY = 1 << 16  # tokens; the shipped corpus is ~44k, a day's slice ~3k
TRAIN_LEARNING_RATE = 3e-3
FINETUNE_LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class TrainHParams:
    """What shapes the compiled step (batch, window) and the optimizer's fixed constants."""

    batch_size: int = 8
    seq_len: int = 64
    weight_decay: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    clip_norm: float = 1.0


DEFAULT_CONFIG = LlamaConfig()
DEFAULT_HPARAMS = TrainHParams()


@dataclass(frozen=True)
class ModelSize:
    """A model and the batch that trains it: the reference workload's ``--model-size`` / ``model_size``."""

    config: LlamaConfig
    hparams: TrainHParams


# "small" is the reference model (about 1.7 M parameters; on one CPU core ~90 ms a step: the demo trains and
# fine-tunes it in well under a minute). "tiny" is the same architecture cut to one layer and a narrow width
# (~0.1 M parameters, ~1 ms a step), for smoke runs and test suites that start many trainers at once. Both
# keep head_dim 128 and the 256-token context the serving manifests ask vLLM for.
SIZES: dict[str, ModelSize] = {
    "small": ModelSize(DEFAULT_CONFIG, DEFAULT_HPARAMS),
    "tiny": ModelSize(
        LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=1),
        TrainHParams(batch_size=4, seq_len=32),
    ),
}
DEFAULT_SIZE = "small"


def size(name: str) -> ModelSize:
    """The named size; ValueError naming the choices for any other name."""
    try:
        return SIZES[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}: one of {sorted(SIZES)}") from None


def optimizer(hparams: TrainHParams, learning_rate: float) -> optax.GradientTransformation:
    """Clip, then AdamW whose learning rate lives in the optimizer state (so it is checkpointed, not compiled)."""
    adamw = optax.inject_hyperparams(optax.adamw)(
        learning_rate=learning_rate, b1=hparams.b1, b2=hparams.b2, weight_decay=hparams.weight_decay
    )
    return optax.chain(optax.clip_by_global_norm(hparams.clip_norm), adamw)


@functools.partial(jax.jit, static_argnums=0)
def _init_opt_state(hparams: TrainHParams, params: Any, learning_rate: jax.Array) -> Any:
    return optimizer(hparams, learning_rate).init(params)  # type: ignore[arg-type]


def init_state(
    config: LlamaConfig = DEFAULT_CONFIG,
    seed: int = 0,
    *,
    params: Any = None,
    learning_rate: float = TRAIN_LEARNING_RATE,
    hparams: TrainHParams = DEFAULT_HPARAMS,
) -> State:
    """A fresh state: new parameters from ``seed`` (or ``params``, e.g. train's final ones for a fine-tune),
    a fresh optimizer at ``learning_rate``, the data key from ``seed``, step 0."""
    param_key, data_key = jax.random.split(jax.random.PRNGKey(seed))
    if params is None:
        params = init_params(config, param_key)
    params = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), params)
    opt_state = _init_opt_state(hparams, params, jnp.float32(learning_rate))
    state = {"params": params, "opt_state": opt_state, "rng": data_key, "step": jnp.zeros((), jnp.int32)}
    # Committed to one device, as an Orbax restore returns arrays: a fresh state and a restored one then lower
    # to the same program (uncommitted inputs compile a second one), so one cache entry serves both.
    return jax.device_put(state, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))


def abstract_state(config: LlamaConfig = DEFAULT_CONFIG, hparams: TrainHParams = DEFAULT_HPARAMS) -> State:
    """The state's structure with ``jax.ShapeDtypeStruct`` leaves, computing nothing: a restore target (Orbax)."""
    return jax.eval_shape(lambda: init_state(config, 0, hparams=hparams))


def prepare_data(tokens: np.ndarray, capacity: int = DATA_CAPACITY) -> Data:
    """A token stream as the step takes it: padded to ``capacity`` (one program for every stage) plus its length."""
    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.ndim != 1 or len(tokens) > capacity:
        raise ValueError(f"need a 1-D stream of at most {capacity} tokens, got shape {tokens.shape}")
    padded = np.full((capacity,), PAD_ID, dtype=np.int32)
    padded[: len(tokens)] = tokens
    return {"tokens": jnp.asarray(padded), "length": jnp.asarray(len(tokens), jnp.int32)}


def batch_for(state: State, data: Data, hparams: TrainHParams = DEFAULT_HPARAMS) -> tuple[jax.Array, jax.Array]:
    """Inputs and next-token targets ``[B, T]`` for ``state``'s step: random windows from ``fold_in(rng, step)``."""
    window = hparams.seq_len + 1
    key = jax.random.fold_in(state["rng"], state["step"])
    starts = jax.random.randint(key, (hparams.batch_size,), 0, jnp.maximum(data["length"] - window + 1, 1))
    rows = jax.vmap(lambda s: jax.lax.dynamic_slice(data["tokens"], (s,), (window,)))(starts)
    return rows[:, :-1], rows[:, 1:]


@functools.partial(jax.jit, static_argnames=("config", "hparams"))
def train_step(
    state: State, data: Data, config: LlamaConfig = DEFAULT_CONFIG, hparams: TrainHParams = DEFAULT_HPARAMS
) -> tuple[State, jax.Array]:
    """One AdamW step on :func:`batch_for`'s batch; returns the next state and this step's loss."""
    inputs, targets = batch_for(state, data, hparams)
    return _update(state, inputs, targets, config, hparams)


def _update(
    state: State, inputs: jax.Array, targets: jax.Array, config: LlamaConfig, hparams: TrainHParams
) -> tuple[State, jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(state["params"], inputs, targets, config)
    updates, opt_state = optimizer(hparams, 0.0).update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt_state, "rng": state["rng"], "step": state["step"] + 1}, loss


@functools.partial(jax.jit, static_argnames=("config", "hparams", "rows"))
def sharded_train_step(
    state: State, data: Data, config: LlamaConfig, hparams: TrainHParams, rows: jax.sharding.Sharding
) -> tuple[State, jax.Array]:
    """:func:`train_step` data-parallel: the same global batch, its rows split over ``rows``' devices (each worker
    computes its slice, :func:`sharded_batch`; XLA all-reduces the gradients: a mean over the whole batch, as the
    loss is), the state replicated. The batch and the update are the one-device step's; the sums over the batch are
    split, so the weights equal one device's to float32 rounding, not bit for bit (tests/include/interlude_workload/
    test_multihost_train.py states the tolerance), and equal any other run on the same number of devices bit for
    bit."""
    inputs, targets = sharded_batch(state, data, hparams, rows)
    return _update(state, inputs, targets, config, hparams)


def sharded_batch(
    state: State, data: Data, hparams: TrainHParams, rows: jax.sharding.Sharding
) -> tuple[jax.Array, jax.Array]:
    """:func:`batch_for`'s global batch laid out over ``rows``' devices: each device holds the rows its slot on the
    mesh's ``data`` axis names (:class:`interlude_workload.distributed.Mesh`; the slots' rows a partition of the
    batch, a slot's devices the same rows). Traced inside :func:`sharded_train_step`; tests/include/
    interlude_workload/test_data_parallel_rows.py holds every device's rows to the one-device batch's."""
    inputs, targets = batch_for(state, data, hparams)
    return jax.lax.with_sharding_constraint(inputs, rows), jax.lax.with_sharding_constraint(targets, rows)


def state_arrays(state: State) -> dict[str, np.ndarray]:
    """Every leaf of ``state`` as a host array, keyed by its path (for digests and a plain numpy round trip)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def state_from_arrays(template: State, arrays: dict[str, np.ndarray]) -> State:
    """The inverse of :func:`state_arrays`, shaped like ``template`` (:func:`abstract_state` or a real state)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(template)
    leaves = []
    for path, leaf in flat:
        value = np.asarray(arrays[jax.tree_util.keystr(path)])
        if value.shape != tuple(leaf.shape) or value.dtype != leaf.dtype:
            raise ValueError(f"{jax.tree_util.keystr(path)}: {value.dtype}{value.shape} does not fit the template")
        leaves.append(value)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # committed, as init_state's: the same program
    return jax.device_put(jax.tree_util.tree_unflatten(treedef, leaves), device)


def params_digest(params: Any) -> str:
    """sha256 over every parameter's bytes, in tree order: equal digests, bit-identical weights."""
    import hashlib

    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        digest.update(jax.tree_util.keystr(path).encode())
        digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()
