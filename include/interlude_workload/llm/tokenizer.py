"""The reference model's tokenizer: byte-level BPE with exactly 512 ids, shipped as Hugging Face files.

``include/data/tokenizer/tokenizer.json`` is what :func:`train_tokenizer` makes from the shipped corpus
(deterministically; a test retrains and compares bytes), and ``tokenizer_config.json`` names its special
tokens, so ``transformers.AutoTokenizer`` and vLLM load the pair as they would any Hugging Face model's.

Byte level (GPT-2's scheme): every UTF-8 byte has an id, so any text encodes and decodes back exactly.
Ids 0, 1, 2 are ``<|bos|>``, ``<|eos|>``, ``<|pad|>``. The post-processor puts ``<|bos|>`` before every
encoded text, as Llama's tokenizers do, so a prompt sent to vLLM, to ``transformers`` or to the stand-in
starts the way each training document started.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from interlude_workload.llm.config import BOS_ID, BOS_TOKEN, EOS_ID, EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS

VOCAB_SIZE = 512
MODEL_MAX_LENGTH = 256
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SHIPPED_DIR = Path(__file__).resolve().parents[2] / "data" / "tokenizer"


def train_tokenizer(corpus: str) -> Tokenizer:
    """Train the byte-level BPE on ``corpus`` to exactly :data:`VOCAB_SIZE` ids (raises if the corpus is too small)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.splitlines(), trainer=trainer)
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS_TOKEN} $A",
                pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
                special_tokens=[(BOS_TOKEN, BOS_ID)],
            ),
        ]
    )
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise ValueError(f"corpus too small: BPE stopped at {tok.get_vocab_size()} ids, need {VOCAB_SIZE}")
    for i, name in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(name) != i:
            raise ValueError(f"{name} must be id {i}")
    return tok


def tokenizer_config() -> dict[str, Any]:
    """``tokenizer_config.json``: without it ``AutoTokenizer`` loads the BPE but knows no bos/eos/pad."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
    }


def tokenizer_files(corpus: str) -> dict[str, str]:
    """The shipped tokenizer directory's files, by name, as text (what the generator writes and the test compares)."""
    return {
        TOKENIZER_FILE: train_tokenizer(corpus).to_str(pretty=True) + "\n",
        TOKENIZER_CONFIG_FILE: json.dumps(tokenizer_config(), indent=2) + "\n",
    }


def load_tokenizer(path: str | Path = SHIPPED_DIR) -> Tokenizer:
    """A ``tokenizer.json``, or the one in directory ``path`` (default: the shipped one)."""
    p = Path(path)
    return Tokenizer.from_file(str(p / TOKENIZER_FILE if p.is_dir() else p))


def encode_documents(tok: Tokenizer, lines: Iterable[str]) -> np.ndarray:
    """One int32 token stream: each non-empty line as ``<|bos|> line <|eos|>``, concatenated in order."""
    docs = [line for line in lines if line.strip()]
    ids: list[int] = []
    for enc in tok.encode_batch(docs):
        ids.extend(enc.ids)  # the post-processor already put <|bos|> first
        ids.append(EOS_ID)
    return np.asarray(ids, dtype=np.int32)


def encode_text(tok: Tokenizer, text: str) -> np.ndarray:
    """:func:`encode_documents` over ``text``'s lines."""
    return encode_documents(tok, text.splitlines())
