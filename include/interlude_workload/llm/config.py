"""The reference language model's shape, and the Hugging Face ``config.json`` that names it as a Llama.

One frozen dataclass is the single source of the architecture: the JAX model (:mod:`.model`) builds its
parameters from it, the export writes it as ``config.json`` for ``LlamaForCausalLM``, and the numpy
forward (:mod:`.numpy_forward`) reads that ``config.json`` back, so what trains and what is served cannot
disagree on a dimension.

Head size 128, the one size both of vLLM's attention backends take as is:

* GPU, FlashAttention: ``FlashAttentionBackend.get_supported_head_sizes()`` is
  ``[32, 64, 96, 128, 160, 192, 224, 256]``
  (https://github.com/vllm-project/vllm/blob/main/vllm/v1/attention/backends/flash_attn.py).
* TPU, Pallas ragged paged attention: "TPU requires the head size to be a multiple of 128"
  (``TPU_HEAD_SIZE_ALIGNMENT = 128``; other sizes are padded up to it in the KV cache),
  https://github.com/vllm-project/tpu-inference/blob/main/tpu_inference/layers/vllm/backends/flash_attn.py.

The other sizes keep a CPU demo fast (1,836,288 parameters; 200 steps of batch 8 x 64 tokens take
seconds on 2 cores) while staying multiples of 128 where TPU tiles care (hidden 256, MLP 768 = 3 x 256,
Llama's ``8/3 * hidden`` rounded up to a multiple of 256). Two query heads share one key/value head
(grouped-query attention, as Llama 3 does), so the export exercises the GQA path of every loader.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

BOS_TOKEN = "<|bos|>"
EOS_TOKEN = "<|eos|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)  # ids 0, 1, 2, in this order
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama decoder: RMSNorm, rotary embeddings (HF ``rotate_half``), GQA attention, SwiGLU MLP, untied head."""

    vocab_size: int = 512
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 128
    max_position_embeddings: int = 256
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2:
            raise ValueError("rotary embeddings need an even head_dim")
        if self.tie_word_embeddings:
            raise ValueError("the reference model keeps an untied lm_head (tie_word_embeddings=False)")

    def to_hf_config(self) -> dict[str, Any]:
        """``config.json`` for ``LlamaForCausalLM``, readable by transformers 4.x and 5.x and by vLLM.

        Both spellings of the changed keys are written: ``torch_dtype`` and ``rope_theta`` (transformers 4,
        and the vLLM images built on it) and ``dtype`` and ``rope_parameters`` (transformers 5).
        """
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "initializer_range": 0.02,
            "pretraining_tp": 1,
            "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "torch_dtype": "float32",
            "dtype": "float32",
            "use_cache": True,
        }

    @classmethod
    def from_hf_config(cls, hf: dict[str, Any]) -> LlamaConfig:
        """The fields this model uses, from a ``config.json`` (the numpy forward and the export check read it)."""
        rope = hf.get("rope_parameters") or {}
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=int(hf["num_hidden_layers"]),
            num_attention_heads=int(hf["num_attention_heads"]),
            num_key_value_heads=int(hf.get("num_key_value_heads") or hf["num_attention_heads"]),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]),
            max_position_embeddings=int(hf["max_position_embeddings"]),
            rms_norm_eps=float(hf["rms_norm_eps"]),
            rope_theta=float(hf.get("rope_theta") or rope.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        )
