"""The Hugging Face export loads with transformers' loaders, answers as the JAX model does, refuses corruption."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from interlude_workload.llm import export, model, numpy_forward, train_step
from interlude_workload.llm.config import BOS_ID, EOS_ID, PAD_ID
from interlude_workload.llm.export import ExportError, verify_export

CONFIG = train_step.DEFAULT_CONFIG


def test_config_json_is_a_llama_that_transformers_loads(export_dir: Path) -> None:
    from transformers import AutoConfig, LlamaConfig

    hf = AutoConfig.from_pretrained(str(export_dir))
    assert type(hf) is LlamaConfig and hf.architectures == ["LlamaForCausalLM"]
    assert hf.head_dim == 128 and hf.num_attention_heads == 2 and hf.num_key_value_heads == 1
    assert (hf.hidden_size, hf.intermediate_size, hf.num_hidden_layers, hf.vocab_size) == (256, 768, 2, 512)
    assert hf.rope_parameters["rope_theta"] == CONFIG.rope_theta and hf.rms_norm_eps == CONFIG.rms_norm_eps
    assert hf.tie_word_embeddings is False
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)


def test_tokenizer_loads_from_the_export_with_auto_tokenizer(export_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(export_dir))
    text = "Ada likes tea and honey.  Ünïcode ✓"
    ids = hf(text)["input_ids"]
    assert ids[0] == BOS_ID and hf.decode(ids, skip_special_tokens=True) == text
    assert (hf.bos_token, hf.eos_token, hf.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    generation = json.loads((export_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == EOS_ID and generation["do_sample"] is False


def test_safetensors_hold_hf_names_in_out_in_layout(export_dir: Path, pretrained: Any) -> None:
    path = str(export_dir / "model.safetensors")
    with safe_open(path, "np") as f:
        assert f.metadata() == {"format": "pt"}
    weights = load_file(path)
    assert {k: v.shape for k, v in weights.items()} == numpy_forward.expected_shapes(CONFIG)
    assert len(weights) == 21
    layer = pretrained["params"]["layers"][1]
    np.testing.assert_array_equal(weights["model.layers.1.self_attn.k_proj.weight"], np.asarray(layer["k_proj"]))
    np.testing.assert_array_equal(weights["model.layers.1.mlp.down_proj.weight"], np.asarray(layer["down_proj"]))
    np.testing.assert_array_equal(weights["lm_head.weight"], np.asarray(pretrained["params"]["lm_head"]))


def test_numpy_logits_equal_jax_logits_within_the_bound(export_dir: Path, pretrained: Any, tok: Any) -> None:
    weights, config = numpy_forward.load_export(export_dir)
    reference = json.loads((export_dir / export.REFERENCE_FILE).read_text())
    prompts = [tok.encode(text).ids for text in export.PROMPTS]
    batch = np.full((len(prompts), max(map(len, prompts))), PAD_ID, np.int32)  # one batch, one compile
    for row, ids in enumerate(prompts):
        batch[row, : len(ids)] = ids
    jax_batch = np.asarray(model.jit_forward(pretrained["params"], batch, CONFIG))
    worst = 0.0
    for row, ids in enumerate(prompts):
        np_logits = numpy_forward.forward(weights, config, ids)
        assert np_logits.shape == (len(ids), 512)
        jax_logits = jax_batch[row, : len(ids)]
        assert export.logits_problem(str(row), jax_logits, np_logits) is None
        # well inside the bound: a tenth of it (measured: ~1e-6 of the largest |logit|, the bound 2e-5 of it)
        worst = max(worst, float(np.max(np.abs(np_logits - jax_logits))) / export.logit_bound(jax_logits))
    assert worst <= 0.1, worst
    assert reference["max_abs_logit_diff"] <= 1e-4
    assert np.max(np.abs(jax_batch)) > 1.0  # a trained model's logits, not a near-zero init that hides errors


def test_numpy_greedy_equals_jax_greedy_and_the_reference(export_dir: Path, pretrained: Any, tok: Any) -> None:
    weights, config = numpy_forward.load_export(export_dir)
    reference = json.loads((export_dir / export.REFERENCE_FILE).read_text())
    assert [p["text"] for p in reference["prompts"]] == list(export.PROMPTS)
    for record in reference["prompts"]:
        ids = tok.encode(record["text"]).ids
        assert record["token_ids"] == ids
        by_numpy = numpy_forward.greedy_generate(weights, config, ids, export.MAX_NEW_TOKENS)
        by_jax = model.greedy_generate(pretrained["params"], CONFIG, ids, export.MAX_NEW_TOKENS)
        assert by_numpy == by_jax == record["greedy_token_ids"]
        assert len(by_jax) >= 2 and record["greedy_text"] == tok.decode(by_jax)


def _rewrite_weights(change: Callable[[dict[str, np.ndarray]], None]) -> Callable[[Path], None]:
    def corrupt(root: Path) -> None:
        weights = load_file(str(root / "model.safetensors"))
        change(weights)
        save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})

    return corrupt


def _transposed(w: dict[str, np.ndarray]) -> None:
    w["model.layers.0.mlp.up_proj.weight"] = np.ascontiguousarray(w["model.layers.0.mlp.up_proj.weight"].T)


def _nudged(w: dict[str, np.ndarray]) -> None:
    w["model.layers.1.self_attn.v_proj.weight"][3, 7] += 1e-3


def _float16(w: dict[str, np.ndarray]) -> None:
    w["model.norm.weight"] = w["model.norm.weight"].astype(np.float16)


def _head_dim_64(root: Path) -> None:
    hf = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**hf, "head_dim": 64}))


def _truncated(root: Path) -> None:
    path = root / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100_000])


CORRUPTIONS: dict[str, Callable[[Path], None]] = {
    "tensor with the wrong shape": _rewrite_weights(_transposed),
    "missing tensor": _rewrite_weights(lambda w: w.pop("model.layers.1.post_attention_layernorm.weight")),
    "unexpected tensor": _rewrite_weights(lambda w: w.update({"model.layers.2.mlp.up_proj.weight": np.zeros(3)})),
    "weight off by 1e-3": _rewrite_weights(_nudged),
    "float16 tensor": _rewrite_weights(_float16),
    "config of another shape": _head_dim_64,
    "truncated safetensors": _truncated,
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_verification_refuses_a_corrupted_export(
    export_dir: Path, pretrained: Any, tmp_path: Path, corrupt: str
) -> None:
    copy = tmp_path / "hf"
    shutil.copytree(export_dir, copy)  # as exported, it passed verify_export (export_hf ran it)
    CORRUPTIONS[corrupt](copy)
    with pytest.raises(ExportError):
        verify_export(copy, pretrained["params"], CONFIG)


def test_export_with_a_foreign_tokenizer_is_refused_and_unmarked(pretrained: Any, tmp_path: Path) -> None:
    """A tokenizer of another vocabulary: the export raises and writes no reference file (its verified mark)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    foreign = tmp_path / "tok"
    foreign.mkdir()
    bpe = Tokenizer(models.BPE(vocab={"<|bos|>": 0, "<|eos|>": 1, "<|pad|>": 2, "a": 3}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.save(str(foreign / "tokenizer.json"))
    (foreign / "tokenizer_config.json").write_text("{}")
    out = tmp_path / "hf"
    with pytest.raises(ExportError, match="tokenizer has 4 ids"):
        export.export_hf(pretrained["params"], CONFIG, foreign, out)
    assert not (out / export.REFERENCE_FILE).exists()


def test_the_logit_bound_scales_with_the_logits_and_refuses_nan() -> None:
    """Two correct float32 forwards differ by rounding that grows with the logits (the module's doc, measured by
    benchmarks/export_tolerance.py): the bound is the floor plus a fraction of the largest |logit|."""
    small, large = np.array([[0.1, -0.2]]), np.array([[40.0, -10.0]])
    assert export.logit_bound(small) == pytest.approx(export.TOLERANCE_ABSOLUTE + 0.2 * export.TOLERANCE_RELATIVE)
    assert export.logit_bound(large) == pytest.approx(export.TOLERANCE_ABSOLUTE + 40 * export.TOLERANCE_RELATIVE)
    # A trained model's 1.7e-5 (what the absolute 1e-5 refused at 2,000 steps) passes at its scale (logits ~20) ...
    assert export.logits_problem("p", large, large + 1.7e-5) is None
    # ... while the same difference on an untrained model's logits is refused, with the figures
    problem = export.logits_problem("Today is", small, small + 1.7e-5)
    assert problem and "prompt 'Today is'" in problem and "1.7e-05 >" in problem and "largest |logit| 0.2" in problem
    assert export.logits_problem("p", large, large + np.nan)


def test_greedy_tokens_may_part_only_at_a_tie_closer_than_the_bound() -> None:
    assert export.greedy_problem("p", [5, 6, 7], [5, 6, 7], [1.0, 1.0, 1.0]) is None
    assert export.greedy_problem("p", [5, 6, 7], [5, 9, 3], [1.0, -0.1, 1.0]) is None  # a near-tie at token 1
    problem = export.greedy_problem("p", [5, 6, 7], [5, 9, 3], [1.0, 0.5, 1.0])
    assert problem and "at new token 1" in problem
    assert export.greedy_problem("p", [5, 6, 1], [5, 6], [1.0, 1.0, 1.0])  # one stopped, the other did not
