"""The reference language model in plain JAX: a Llama decoder whose parameters map one to one onto HF names.

Plain functions over a dict pytree (no Flax): the parameters are exactly what an Orbax checkpoint and a
``model.safetensors`` hold, under Hugging Face's module names and in its ``[out, in]`` layout, so the
export (:mod:`.export`) is a rename-free copy and the numpy forward (:mod:`.numpy_forward`), Hugging Face
``transformers`` and vLLM compute the same function::

    {"embed_tokens": [V, H],
     "layers": [{"input_layernorm": [H], "q_proj": [nH*D, H], "k_proj": [nKV*D, H], "v_proj": [nKV*D, H],
                 "o_proj": [H, nH*D], "post_attention_layernorm": [H],
                 "gate_proj": [I, H], "up_proj": [I, H], "down_proj": [H, I]}, ...],
     "norm": [H], "lm_head": [V, H]}

Every matmul runs at ``Precision.HIGHEST``: on CPU that is what float32 does anyway, on TPU (bf16 passes
by default) and on Ampere+ GPUs (TF32) it keeps the JAX logits within 1e-5 of a float32 reference, which
the export's verification demands on any accelerator family.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from interlude_workload.llm.config import EOS_ID, LlamaConfig

Params = dict[str, Any]
_HIGHEST = jax.lax.Precision.HIGHEST
LAYER_KEYS = (
    "input_layernorm",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "post_attention_layernorm",
    "gate_proj",
    "up_proj",
    "down_proj",
)


def param_shapes(config: LlamaConfig) -> Params:
    """The shape of every parameter, as a pytree of tuples shaped like the parameters themselves."""
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    layer = {
        "input_layernorm": (h,),
        "q_proj": (q, h),
        "k_proj": (kv, h),
        "v_proj": (kv, h),
        "o_proj": (h, q),
        "post_attention_layernorm": (h,),
        "gate_proj": (i, h),
        "up_proj": (i, h),
        "down_proj": (h, i),
    }
    return {
        "embed_tokens": (config.vocab_size, h),
        "layers": [dict(layer) for _ in range(config.num_hidden_layers)],
        "norm": (h,),
        "lm_head": (config.vocab_size, h),
    }


@functools.partial(jax.jit, static_argnums=0)
def init_params(config: LlamaConfig, key: jax.Array) -> Params:
    """Normal(0, 0.02) weights (HF's ``initializer_range``), ones for the RMSNorm scales. Jitted: one compile."""
    shapes = param_shapes(config)
    leaves, treedef = jax.tree_util.tree_flatten(shapes, is_leaf=lambda x: isinstance(x, tuple))
    keys = jax.random.split(key, len(leaves))
    out = [
        jnp.ones(shape, jnp.float32) if len(shape) == 1 else 0.02 * jax.random.normal(k, shape, jnp.float32)
        for k, shape in zip(keys, leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, out)


def _linear(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x @ w.T`` with ``w`` in HF's ``[out, in]`` layout."""
    return jnp.einsum("...i,oi->...o", x, w, precision=_HIGHEST)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    variance = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return weight * (x * jax.lax.rsqrt(variance + eps))


def rope_tables(seq_len: int, config: LlamaConfig) -> tuple[jax.Array, jax.Array]:
    """cos/sin ``[T, D]`` as HF's default rotary embedding builds them (frequencies repeated, not interleaved)."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    freqs = jnp.arange(seq_len, dtype=jnp.float32)[:, None] * inv_freq[None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x`` is ``[B, T, heads, D]``; cos/sin ``[T, D]`` broadcast over batch and heads."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


def _attention(layer: Params, h: jax.Array, cos: jax.Array, sin: jax.Array, config: LlamaConfig) -> jax.Array:
    b, t, _ = h.shape
    d, nh, nkv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    q = _apply_rope(_linear(h, layer["q_proj"]).reshape(b, t, nh, d), cos, sin)
    k = _apply_rope(_linear(h, layer["k_proj"]).reshape(b, t, nkv, d), cos, sin)
    v = _linear(h, layer["v_proj"]).reshape(b, t, nkv, d)
    # GQA as HF's repeat_kv: query head j reads key/value head j // (nh // nkv).
    k = jnp.repeat(k, nh // nkv, axis=2)
    v = jnp.repeat(v, nh // nkv, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=_HIGHEST) / np.sqrt(d).astype(np.float32)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(causal[None, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs, v, precision=_HIGHEST).reshape(b, t, nh * d)
    return _linear(out, layer["o_proj"])


def _mlp(layer: Params, h: jax.Array) -> jax.Array:
    return _linear(jax.nn.silu(_linear(h, layer["gate_proj"])) * _linear(h, layer["up_proj"]), layer["down_proj"])


def forward(params: Params, tokens: jax.Array, config: LlamaConfig) -> jax.Array:
    """Logits ``[B, T, V]`` (float32) for token ids ``[B, T]``; position 0 is the first token."""
    x = params["embed_tokens"][tokens]
    cos, sin = rope_tables(tokens.shape[1], config)
    for layer in params["layers"]:
        x = x + _attention(layer, rms_norm(x, layer["input_layernorm"], config.rms_norm_eps), cos, sin, config)
        x = x + _mlp(layer, rms_norm(x, layer["post_attention_layernorm"], config.rms_norm_eps))
    return _linear(rms_norm(x, params["norm"], config.rms_norm_eps), params["lm_head"])


def loss_fn(params: Params, inputs: jax.Array, targets: jax.Array, config: LlamaConfig) -> jax.Array:
    """Mean next-token cross entropy over every position of the batch."""
    logits = forward(params, inputs, config)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return -jnp.mean(picked)


jit_forward = jax.jit(forward, static_argnums=2)
PAD_MULTIPLE = 64  # sequences are right-padded to a multiple of this: one compiled forward for many lengths


def padded_logits(params: Params, config: LlamaConfig, token_ids: list[int] | np.ndarray) -> np.ndarray:
    """Logits ``[T, V]`` of one sequence, computed right-padded to a multiple of :data:`PAD_MULTIPLE`.

    Causal attention makes the padding invisible to the real positions, and the padding lets prompts of
    different lengths share one compiled program.
    """
    ids = np.asarray(token_ids, dtype=np.int32)
    length = -(-max(len(ids), 1) // PAD_MULTIPLE) * PAD_MULTIPLE
    buf = np.zeros((1, length), np.int32)
    buf[0, : len(ids)] = ids
    return np.asarray(jit_forward(params, jnp.asarray(buf), config))[0, : len(ids)]


def greedy_generate(params: Params, config: LlamaConfig, token_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of ``token_ids``, stopping after ``<|eos|>`` (included) or at the context length.

    Returns only the new tokens: the same contract as :func:`interlude_workload.llm.numpy_forward.greedy_generate`.
    """
    ids = list(token_ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        if len(ids) >= config.max_position_embeddings:
            break
        nxt = int(np.argmax(padded_logits(params, config, ids)[-1]))
        new.append(nxt)
        ids.append(nxt)
        if nxt == EOS_ID:
            break
    return new
