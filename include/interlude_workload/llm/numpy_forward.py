"""A pure-numpy Llama forward over a Hugging Face export: what the vLLM stand-in serves, no JAX imported.

It reads exactly what real loaders read, ``config.json`` and ``model.safetensors`` under Hugging Face's
tensor names, and computes what ``LlamaForCausalLM`` computes (RMSNorm, rotary embeddings in the
``rotate_half`` convention, grouped-query causal attention, SwiGLU, untied ``lm_head``), in float32.
So the stand-in answers with the exported weights' own greedy tokens, and the export's verification
(:mod:`.export`) compares it with the JAX model that trained them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from interlude_workload.llm.config import EOS_ID, LlamaConfig

Weights = dict[str, np.ndarray]
_LAYER_TENSORS = {
    "input_layernorm.weight": lambda c: (c.hidden_size,),
    "self_attn.q_proj.weight": lambda c: (c.num_attention_heads * c.head_dim, c.hidden_size),
    "self_attn.k_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, c.hidden_size),
    "self_attn.v_proj.weight": lambda c: (c.num_key_value_heads * c.head_dim, c.hidden_size),
    "self_attn.o_proj.weight": lambda c: (c.hidden_size, c.num_attention_heads * c.head_dim),
    "post_attention_layernorm.weight": lambda c: (c.hidden_size,),
    "mlp.gate_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "mlp.up_proj.weight": lambda c: (c.intermediate_size, c.hidden_size),
    "mlp.down_proj.weight": lambda c: (c.hidden_size, c.intermediate_size),
}


class ExportError(ValueError):
    """The export is not a loadable, faithful copy of the model (missing/extra tensor, shape, dtype, logits)."""


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor ``LlamaForCausalLM`` loads for this config, by its Hugging Face name."""
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, config.hidden_size),
        "model.norm.weight": (config.hidden_size,),
        "lm_head.weight": (config.vocab_size, config.hidden_size),
    }
    for n in range(config.num_hidden_layers):
        for name, shape in _LAYER_TENSORS.items():
            shapes[f"model.layers.{n}.{name}"] = shape(config)
    return shapes


def check_weights(weights: Weights, config: LlamaConfig) -> None:
    """Raise :class:`ExportError` unless ``weights`` holds exactly the expected tensors, shapes and float32."""
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise ExportError(f"tensor names differ from LlamaForCausalLM's: missing {missing}, unexpected {extra}")
    for name, shape in expected.items():
        array = weights[name]
        if tuple(array.shape) != shape or array.dtype != np.float32:
            raise ExportError(f"{name}: {array.dtype}{list(array.shape)}, expected float32{list(shape)}")


def load_export(export_dir: str | Path) -> tuple[Weights, LlamaConfig]:
    """``model.safetensors`` and ``config.json`` of an export directory, checked against each other."""
    from safetensors.numpy import load_file

    root = Path(export_dir)
    config = LlamaConfig.from_hf_config(json.loads((root / "config.json").read_text()))
    weights = load_file(str(root / "model.safetensors"))
    check_weights(weights, config)
    return weights, config


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(np.square(x), axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + np.float32(eps)))


def _rope(seq_len: int, config: LlamaConfig) -> tuple[np.ndarray, np.ndarray]:
    d = config.head_dim
    inv_freq = (1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))).astype(np.float32)
    freqs = np.arange(seq_len, dtype=np.float32)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb), np.sin(emb)


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _attention(w: Weights, p: str, h: np.ndarray, cos: np.ndarray, sin: np.ndarray, c: LlamaConfig) -> np.ndarray:
    t, d, nh, nkv = h.shape[0], c.head_dim, c.num_attention_heads, c.num_key_value_heads
    q = (h @ w[f"{p}self_attn.q_proj.weight"].T).reshape(t, nh, d).transpose(1, 0, 2)
    k = (h @ w[f"{p}self_attn.k_proj.weight"].T).reshape(t, nkv, d).transpose(1, 0, 2)
    v = (h @ w[f"{p}self_attn.v_proj.weight"].T).reshape(t, nkv, d).transpose(1, 0, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
    scores = (q @ k.transpose(0, 2, 1)) / np.float32(np.sqrt(d))
    scores = np.where(np.tril(np.ones((t, t), dtype=bool)), scores, np.finfo(np.float32).min)
    out = (_softmax(scores) @ v).transpose(1, 0, 2).reshape(t, nh * d)
    return out @ w[f"{p}self_attn.o_proj.weight"].T


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def forward(weights: Weights, config: LlamaConfig, token_ids: list[int] | np.ndarray) -> np.ndarray:
    """Logits ``[T, V]`` (float32) for one sequence of token ids."""
    ids = np.asarray(token_ids, dtype=np.int64)
    x = weights["model.embed_tokens.weight"][ids].astype(np.float32)
    cos, sin = _rope(len(ids), config)
    eps = config.rms_norm_eps
    for n in range(config.num_hidden_layers):
        p = f"model.layers.{n}."
        x = x + _attention(weights, p, _rms_norm(x, weights[f"{p}input_layernorm.weight"], eps), cos, sin, config)
        h = _rms_norm(x, weights[f"{p}post_attention_layernorm.weight"], eps)
        gate = _silu(h @ weights[f"{p}mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ weights[f"{p}mlp.up_proj.weight"].T)) @ weights[f"{p}mlp.down_proj.weight"].T
    return _rms_norm(x, weights["model.norm.weight"], eps) @ weights["lm_head.weight"].T


def greedy_generate(weights: Weights, config: LlamaConfig, token_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation, stopping after ``<|eos|>`` (included, as vLLM returns it); only the new tokens."""
    ids = list(token_ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        if len(ids) >= config.max_position_embeddings:
            break
        nxt = int(np.argmax(forward(weights, config, ids)[-1]))
        new.append(nxt)
        ids.append(nxt)
        if nxt == EOS_ID:
            break
    return new


def describe(weights: Weights) -> dict[str, Any]:
    """Tensor count and parameter total, for logs."""
    return {"tensors": len(weights), "parameters": int(sum(a.size for a in weights.values()))}
