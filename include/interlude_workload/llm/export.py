"""Export the JAX model as a Hugging Face model directory, verified before anyone serves it.

``export_hf(params, config, tokenizer_dir, out_dir)`` writes what ``LlamaForCausalLM.from_pretrained``,
vLLM (``--load-format safetensors``/``auto`` from a directory or a Cloud Storage FUSE mount,
``runai_streamer`` from ``gs://``) and the local stand-in read::

    config.json               LlamaForCausalLM, float32, bos/eos/pad 0/1/2 (LlamaConfig.to_hf_config)
    model.safetensors         HF tensor names, [out, in] layout, metadata {"format": "pt"}
    tokenizer.json            the byte-level BPE, copied from tokenizer_dir
    tokenizer_config.json     its special tokens, copied from tokenizer_dir
    generation_config.json    bos/eos/pad, greedy
    interlude_reference.json  fixed prompts, their token ids, the JAX model's last-position logits and
                              greedy completions (what benchmarks/export_parity.py compares real loaders with)

It writes to a local directory: the caller uploads it to Cloud Storage and commits it with its marker.
Then it verifies what it wrote by reading it back as a loader would (tensor names, shapes and dtypes
against ``config.json``, every tensor bit for bit against the weights, the tokenizer's ids) and comparing the
numpy forward over the written safetensors with the JAX forward over ``params`` on fixed prompts: logits within
:func:`logit_bound` and equal greedy completions, or :class:`ExportError`.

The bound is relative to the logits' scale. Both forwards are correct float32 programs that round differently (sums
in another order, fused operations), so their difference grows with the logits, and the logits grow as a model
trains: an absolute 1e-5 refused every correct run of the default model past a few hundred steps (1.24e-5 to
1.72e-5). Measured with ``benchmarks/export_tolerance.py`` (the workload README has the figures): over both sizes,
0 to 5,000 training steps and a 200-step fine-tune, correct exports differ by at most 2.1e-6 of the prompt's
largest |logit| (2.67e-5 at |logit| 13, the default model after 2,000 steps); a loader that reads one row of the
output head as the next differs by 1.0e-4 to 8.3e-4 of it, two layers' weights exchanged by 0.24 or more. The bound,
:data:`TOLERANCE_ABSOLUTE` + :data:`TOLERANCE_RELATIVE` x the largest |logit|, sits ~10 times above the first and
~5 times below the subtlest of the second. A corruption of the weights themselves is not left to it: every tensor
is compared bit for bit first.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from interlude_workload.llm import model, numpy_forward
from interlude_workload.llm.config import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, LlamaConfig
from interlude_workload.llm.numpy_forward import ExportError
from interlude_workload.llm.tokenizer import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, load_tokenizer

TOLERANCE_RELATIVE = 2e-5  # of the prompt's largest |JAX logit|
TOLERANCE_ABSOLUTE = 1e-5  # the floor, for an untrained model whose logits are near 0
PROMPTS = ("Today is", "The quick fox", "Ada likes", "On 2024-02-01 the weather")
MAX_NEW_TOKENS = 16
REFERENCE_FILE = "interlude_reference.json"
REFERENCE_FORMAT = "interlude-export-reference/1"
_HF_LAYER_NAMES = {
    "input_layernorm": "input_layernorm",
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "post_attention_layernorm": "post_attention_layernorm",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}

__all__ = [
    "ExportError",
    "export_hf",
    "greedy_problem",
    "logit_bound",
    "logits_problem",
    "to_hf_tensors",
    "verify_export",
]


def to_hf_tensors(params: Any) -> dict[str, np.ndarray]:
    """The model's parameters under Hugging Face Llama names, as contiguous float32 host arrays."""

    def host(a: Any) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(a, dtype=np.float32))

    tensors = {
        "model.embed_tokens.weight": host(params["embed_tokens"]),
        "model.norm.weight": host(params["norm"]),
        "lm_head.weight": host(params["lm_head"]),
    }
    for n, layer in enumerate(params["layers"]):
        for key, hf in _HF_LAYER_NAMES.items():
            tensors[f"model.layers.{n}.{hf}.weight"] = host(layer[key])
    return tensors


def generation_config() -> dict[str, Any]:
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False}


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n")


def export_hf(
    params: Any,
    config: LlamaConfig,
    tokenizer_dir: str | Path,
    out_dir: str | Path,
    *,
    prompts: tuple[str, ...] = PROMPTS,
) -> float:
    """Write the Hugging Face directory ``out_dir`` (local), verify it, and return the max |logit| difference.

    Raises :class:`ExportError` (after writing, before the reference file) when the verification fails.
    """
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / REFERENCE_FILE).unlink(missing_ok=True)  # present only once this export has been verified
    save_file(to_hf_tensors(params), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", config.to_hf_config())
    _write_json(out / "generation_config.json", generation_config())
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE):
        shutil.copyfile(Path(tokenizer_dir) / name, out / name)
    reference = verify_export(out, params, config, prompts=prompts)
    _write_json(out / REFERENCE_FILE, reference)
    return float(reference["max_abs_logit_diff"])


def _check_config(export_dir: Path, config: LlamaConfig) -> None:
    written = LlamaConfig.from_hf_config(json.loads((export_dir / "config.json").read_text()))
    if written != config:
        raise ExportError(f"config.json describes {written}, the model is {config}")


def _check_bits(weights: dict[str, np.ndarray], params: Any) -> None:
    """Every written tensor is the model's, bit for bit (float32 in, float32 out): a corruption too small for any
    logit bound to see (one weight off by 1e-3) is refused here; the logits then check how a loader reads them."""
    for name, want in to_hf_tensors(params).items():
        got = weights[name]
        if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
            count = int(np.sum(got != want)) if got.shape == want.shape else got.size
            raise ExportError(f"{name} is not the model's weights ({count} of {want.size} values differ)")


def _check_tokenizer(export_dir: Path, config: LlamaConfig) -> Any:
    tok = load_tokenizer(export_dir)
    if tok.get_vocab_size() != config.vocab_size:
        raise ExportError(f"tokenizer has {tok.get_vocab_size()} ids, the model {config.vocab_size}")
    ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
    if ids != [BOS_ID, EOS_ID, PAD_ID]:
        raise ExportError(f"special tokens {SPECIAL_TOKENS} have ids {ids}, expected {[BOS_ID, EOS_ID, PAD_ID]}")
    return tok


def logit_bound(jax_logits: np.ndarray) -> float:
    """The largest |difference| two correct float32 forwards may show on these logits (see the module's doc)."""
    return TOLERANCE_ABSOLUTE + TOLERANCE_RELATIVE * float(np.max(np.abs(jax_logits)))


def logits_problem(text: str, jax_logits: np.ndarray, export_logits: np.ndarray) -> str | None:
    """Why the export's logits for prompt ``text`` are not the model's (None: they are), with the figures."""
    diff = float(np.max(np.abs(export_logits - jax_logits)))
    bound = logit_bound(jax_logits)
    if diff <= bound:  # also refuses NaN
        return None
    scale = float(np.max(np.abs(jax_logits)))
    return (
        f"prompt {text!r}: numpy logits differ from JAX by {diff:.3g} > {bound:.3g} "
        f"({TOLERANCE_ABSOLUTE:g} + {TOLERANCE_RELATIVE:g} x the largest |logit| {scale:.3g})"
    )


def greedy_problem(text: str, jax_new: list[int], export_new: list[int], margins: list[float]) -> str | None:
    """Why the export's greedy tokens are not the model's (None: they are).

    ``margins[i]``: the JAX logits' gap between the best and second-best token at new token ``i``, and the bound
    there. Where the first difference falls on a tie closer than the bound (the two forwards may rank a near-tie
    either way, both correctly), the completions agree up to it, and what follows is another prompt."""
    for i, (a, b) in enumerate(zip(jax_new, export_new, strict=False)):
        if a != b:
            if margins[i] <= 0.0:
                return None
            return f"prompt {text!r}: greedy tokens differ at new token {i}, JAX {jax_new} vs export {export_new}"
    if len(jax_new) != len(export_new):
        return f"prompt {text!r}: greedy tokens differ in length, JAX {jax_new} vs export {export_new}"
    return None


def _jax_greedy(params: Any, config: LlamaConfig, ids: list[int]) -> tuple[list[int], list[float]]:
    """The JAX model's greedy tokens, and at each the best-vs-second gap less the bound (<= 0: a near-tie)."""
    tokens, margins = list(ids), []
    new: list[int] = []
    for _ in range(MAX_NEW_TOKENS):
        if len(tokens) >= config.max_position_embeddings:
            break
        logits = model.padded_logits(params, config, tokens)[-1]
        top2 = np.sort(logits)[-2:]
        margins.append(float(top2[1] - top2[0]) - 2 * logit_bound(logits))
        nxt = int(np.argmax(logits))
        new.append(nxt)
        tokens.append(nxt)
        if nxt == EOS_ID:
            break
    return new, margins


def verify_export(
    export_dir: str | Path, params: Any, config: LlamaConfig, *, prompts: tuple[str, ...] = PROMPTS
) -> dict[str, Any]:
    """Read the export back and compare it with ``params``; the reference record, or :class:`ExportError`."""
    root = Path(export_dir)
    _check_config(root, config)
    from safetensors import SafetensorError

    try:
        weights, _ = numpy_forward.load_export(root)
    except (OSError, ValueError, SafetensorError) as exc:
        raise ExportError(f"model.safetensors does not load as this model: {exc}") from exc
    _check_bits(weights, params)
    tok = _check_tokenizer(root, config)
    records, worst = [], 0.0
    for text in prompts:
        ids = tok.encode(text).ids
        jax_logits = model.padded_logits(params, config, ids)
        np_logits = numpy_forward.forward(weights, config, ids)
        problem = logits_problem(text, jax_logits, np_logits)
        if problem:
            raise ExportError(problem)
        worst = max(worst, float(np.max(np.abs(np_logits - jax_logits))))
        jax_new, margins = _jax_greedy(params, config, ids)
        np_new = numpy_forward.greedy_generate(weights, config, ids, MAX_NEW_TOKENS)
        problem = greedy_problem(text, jax_new, np_new, margins)
        if problem:
            raise ExportError(problem)
        records.append(
            {
                "text": text,
                "token_ids": ids,
                "jax_last_logits": [float(x) for x in jax_logits[-1]],
                "greedy_token_ids": jax_new,
                "greedy_text": tok.decode(jax_new),
            }
        )
    return {
        "format": REFERENCE_FORMAT,
        "tolerance": {"absolute": TOLERANCE_ABSOLUTE, "relative": TOLERANCE_RELATIVE},
        "max_abs_logit_diff": worst,
        "max_new_tokens": MAX_NEW_TOKENS,
        "prompts": records,
    }
