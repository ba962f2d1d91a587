"""The model the vLLM stand-in serves: a Hugging Face export, tokenized, run and detokenized as vLLM would.

Loading follows vLLM's steps and refusals (:mod:`standin_export`). Serving a completion:

- the prompt is encoded with the export's ``tokenizer.json`` (the ``tokenizers`` library that
  ``PreTrainedTokenizerFast``, vLLM's tokenizer for this export, wraps), special tokens added as its
  post-processor says (``<|bos|>`` first);
- tokens are the export's own greedy ones: ``interlude_workload.llm.numpy_forward.greedy_generate``, one token
  at a time so a request can be paced (``VLLM_STANDIN_SECONDS_PER_TOKEN``); decoding stops at an end-of-sequence
  id - ``eos_token_id`` of config.json and generation_config.json, the tokenizer's ``eos_token`` - (``finish_reason``
  "stop"; the id counts as a completion token but is not in the text, as in vLLM) or at ``max_tokens`` ("length");
- the text is the new ids decoded with ``skip_special_tokens`` (vLLM's default).

Every request decodes greedily, whatever its ``temperature``: the stand-in is not a sampler.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from standin_export import (
    VllmStartupError,
    check_architecture,
    check_tensors,
    max_model_len,
    pull,
    read_config,
    read_weights,
    resolve_load_format,
)

TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class Completion:
    text: str
    prompt_tokens: int
    token_ids: list[int]
    finish_reason: str  # "stop" (end of sequence) or "length" (max_tokens)


@dataclass(frozen=True)
class ServedModel:
    uri: str  # the model argument, as /v1/models reports it (root)
    weights_sha256: str
    max_model_len: int
    weights: dict[str, np.ndarray]
    config: Any  # interlude_workload.llm.config.LlamaConfig
    tokenizer: Any  # tokenizers.Tokenizer
    eos_ids: frozenset[int]

    def encode(self, prompt: str) -> list[int]:
        return list(self.tokenizer.encode(prompt).ids)

    def complete(self, prompt_ids: list[int], max_tokens: int, pace: float = 0.0) -> Completion:
        from interlude_workload.llm.numpy_forward import greedy_generate

        ids, new = list(prompt_ids), []
        finish = "length"
        for _ in range(max_tokens):
            step = greedy_generate(self.weights, self.config, ids, 1)
            if not step:  # the model's context is full
                break
            new.append(step[0])
            ids.append(step[0])
            if pace > 0:
                time.sleep(pace)
            if step[0] in self.eos_ids:
                finish = "stop"
                break
        shown = new[:-1] if finish == "stop" else new  # vLLM leaves the stop token out of the text
        text = self.tokenizer.decode(shown, skip_special_tokens=True)
        return Completion(text, len(prompt_ids), new, finish)


def _load_tokenizer(directory: Path) -> Any:
    from tokenizers import Tokenizer

    path = directory / TOKENIZER_FILE
    if not path.is_file():  # what transformers' AutoTokenizer says when a directory has no tokenizer files
        raise VllmStartupError(
            "OSError",
            f"Can't load tokenizer for '{directory}'. If you were trying to load it from "
            "'https://huggingface.co/models', make sure you don't have a local directory with the same name. "
            f"Otherwise, make sure '{directory}' is the correct path to a directory containing all relevant files "
            "for a PreTrainedTokenizerFast tokenizer.",
        )
    return Tokenizer.from_file(str(path))


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, list) else {int(value)}


def _eos_ids(directory: Path, hf_config: dict[str, Any], tokenizer: Any) -> frozenset[int]:
    """config.json's and generation_config.json's eos_token_id, and the tokenizer's eos_token (as vLLM stops)."""
    ids = _ids(hf_config.get("eos_token_id"))
    generation = directory / "generation_config.json"
    if generation.is_file():
        ids |= _ids(json.loads(generation.read_text()).get("eos_token_id"))
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():
        token = json.loads(tokenizer_config.read_text()).get("eos_token")
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and tokenizer.token_to_id(token) is not None:
            ids.add(int(tokenizer.token_to_id(token)))
    return frozenset(ids)


def load_model(model: str, load_format: str = "auto", requested_len: int | None = None) -> ServedModel:
    """The export at `model` (gs:// URI or local directory), or VllmStartupError as vLLM would refuse it."""
    from interlude_workload.llm.config import LlamaConfig
    from interlude_workload.llm.numpy_forward import expected_shapes

    source = pull(model)
    hf_config = read_config(source)
    load_format = resolve_load_format(source, load_format)
    length = max_model_len(hf_config, requested_len)
    check_architecture(hf_config)
    try:
        config = LlamaConfig.from_hf_config(hf_config)
    except (KeyError, TypeError, ValueError) as exc:
        raise VllmStartupError("ValueError", f"config.json does not describe a Llama model: {exc!r}") from exc
    tokenizer = _load_tokenizer(source.directory)
    weights, digest = read_weights(source, load_format)
    check_tensors(weights, expected_shapes(config))
    weights = {name: np.asarray(array, dtype=np.float32) for name, array in weights.items()}
    return ServedModel(
        model, digest, length, weights, config, tokenizer, _eos_ids(source.directory, hf_config, tokenizer)
    )
