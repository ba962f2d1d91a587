"""The shipped corpus and tokenizer are what the generator makes, and Hugging Face's loaders read them exactly."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from interlude_workload.llm import corpus
from interlude_workload.llm.config import BOS_ID, EOS_ID, PAD_ID
from interlude_workload.llm.tokenizer import SHIPPED_DIR, VOCAB_SIZE, encode_documents

DATA_DIR = Path(__file__).resolve().parents[4] / "include" / "data"
# Unicode beyond the corpus, control bytes, runs of spaces, a leading space, an emoji split across byte tokens.
AWKWARD = "  naïve café 🙂 — …\tx=1  two  spaces\nПривет, мир! \x00\x7f Today is 2024-02-01."


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("generate_text", DATA_DIR / "generate_text.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_files_are_exactly_what_the_generator_makes() -> None:
    generated = _generator().generated_files()
    assert set(generated) == {"corpus.txt", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"}
    for rel, text in generated.items():
        assert (DATA_DIR / rel).read_text(encoding="utf-8") == text, f"{rel} differs: run include/data/generate_text.py"


def test_tokenizer_has_512_ids_and_the_special_tokens_first(tok: Any) -> None:
    assert tok.get_vocab_size() == VOCAB_SIZE == 512
    assert [tok.id_to_token(i) for i in (BOS_ID, EOS_ID, PAD_ID)] == ["<|bos|>", "<|eos|>", "<|pad|>"]
    ids = tok.encode("Today is").ids
    assert ids[0] == BOS_ID and BOS_ID not in ids[1:]
    assert tok.decode(tok.encode(AWKWARD).ids) == AWKWARD


def test_auto_tokenizer_reads_the_shipped_directory_exactly(tok: Any) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(SHIPPED_DIR))
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    ids = hf(AWKWARD)["input_ids"]
    assert ids == tok.encode(AWKWARD).ids  # transformers and the stand-in's `tokenizers` agree, <|bos|> included
    assert hf.decode(ids, skip_special_tokens=True) == AWKWARD
    assert hf.decode(ids + [EOS_ID], skip_special_tokens=True) == AWKWARD


def test_documents_are_framed_by_bos_and_eos(tok: Any) -> None:
    stream = encode_documents(tok, ["Ada likes tea.", "", "Today is 2024-02-01."]).tolist()
    first = tok.encode("Ada likes tea.").ids
    second = tok.encode("Today is 2024-02-01.").ids
    assert stream == [*first, EOS_ID, *second, EOS_ID]  # the empty line is no document


def test_a_days_slice_says_that_day_and_only_that_day() -> None:
    text = corpus.finetune_text("2024-02-01")
    assert text == corpus.finetune_text("2024-02-01")
    lines = text.splitlines()
    assert lines.count("Today is 2024-02-01.") == len(lines) // 2
    assert not [line for line in lines if line.startswith("Today is") and "2024-02-01" not in line]
    assert corpus.finetune_text("2024-02-02") != text
    assert corpus.day_answer("2024-02-01") == " 2024-02-01."
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        corpus.finetune_text("2024-13-01")


def test_the_corpus_states_many_days_but_no_single_one_dominates() -> None:
    days = [line for line in corpus.load_corpus().splitlines() if line.startswith(corpus.DAY_PROMPT)]
    assert len(days) > 300
    assert max(days.count(d) for d in set(days)) < 5


def test_numpy_forward_needs_no_jax() -> None:
    """The stand-in imports the numpy forward; JAX (2 s of import, ~600 MB) must not come with it."""
    import subprocess

    code = (
        "import sys, interlude_workload.llm.numpy_forward, interlude_workload.llm.config;"
        "sys.exit(3 if 'jax' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
