"""The vLLM stand-in's model loading: a Hugging Face export, read and refused the way vLLM reads and refuses it.

vLLM's path for ``vllm serve MODEL`` (the releases the images pin, 0.11 GPU / TPU 0.18), which this follows:

1. an object-store URI (``gs://``, ``s3://``, ``az://``: vLLM's ``is_runai_obj_uri``) is pulled without its
   weights (``*.json``, tokenizer files) into a local directory that then stands for the model
   (``ModelConfig.maybe_pull_model_tokenizer_for_runai``); Cloud Storage through ``STORAGE_EMULATOR_HOST``
   when set, as the Run:ai streamer's GCS client does;
2. ``config.json`` must be there: else ``ValueError: Invalid repository ID or local directory specified``;
3. an object-store model needs the streamer: ``--load-format auto`` becomes ``runai_streamer`` ("Detected
   Run:ai model config"), any other format is a ``ValueError`` (``VllmConfig.__post_init__``);
4. ``--max-model-len`` may not exceed ``max_position_embeddings`` (pydantic's ``ValidationError``);
5. the architecture must be one vLLM has (the stand-in implements ``LlamaForCausalLM`` only);
6. the loader must be registered (``Load format `X` is not supported``) and find weights
   (``Cannot find any ... model weights with``); every tensor must be one ``LlamaForCausalLM`` has
   (``KeyError``), of its shape (``AssertionError``), and none may be missing (``ValueError``).

Each refusal is a :class:`VllmStartupError` carrying vLLM's exception class and text; the stand-in prints it
and exits 1, as ``vllm serve`` does when its engine fails to start. The forward pass is the workload's own
numpy Llama (``interlude_workload.llm.numpy_forward``): the answers are the export's greedy tokens.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OBJECT_SCHEMES = ("s3://", "gs://", "az://")  # vllm/transformers_utils/runai_utils.py SUPPORTED_SCHEMES
CONFIG_PATTERNS = ("*.model", "*.py", "*.json")  # what vLLM pulls for the config
WEIGHT_PATTERNS = ("*.pt", "*.safetensors", "*.bin", "*.tensors", "*.pth")  # what it leaves for the loader
# LoadFormats of vllm/config/load.py: formats vLLM registers a loader for.
LOAD_FORMATS = (
    "auto", "bitsandbytes", "dummy", "fastsafetensors", "gguf", "mistral", "npcache", "pt", "runai_streamer",
    "runai_streamer_sharded", "safetensors", "sharded_state", "tensorizer",
)  # fmt: skip
STREAMER_FORMATS = ("runai_streamer", "runai_streamer_sharded")
EMULATED_FORMATS = ("auto", "safetensors", "runai_streamer", "pt", "npcache")
ARCHITECTURE = "LlamaForCausalLM"
LONG_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


class VllmStartupError(Exception):
    """Why vLLM would not start: its exception class name and its message."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.kind}: {self.args[0]}"


@dataclass(frozen=True)
class Source:
    """Where the weights are: the object-store URI (streamed) or the local directory (read from disk)."""

    model: str  # as given to `vllm serve` (what /v1/models reports as root)
    directory: Path  # config.json, tokenizer files: pulled for an object-store model
    remote: bool


def is_object_uri(model: str) -> bool:
    return model.lower().startswith(OBJECT_SCHEMES)


def _bucket_prefix(uri: str) -> tuple[str, str]:
    bucket, _, path = uri[len("gs://") :].partition("/")
    return bucket, path.strip("/") + "/" if path.strip("/") else ""


def _gcs_objects(uri: str) -> list[Any]:
    """The objects directly under the export's prefix (a flat Hugging Face directory)."""
    from interlude_workload.gcs import storage_client

    if not uri.startswith("gs://"):
        raise VllmStartupError("NotImplementedError", f"the stand-in reads gs:// only, not {uri}")
    bucket, prefix = _bucket_prefix(uri)
    blobs = storage_client().list_blobs(bucket, prefix=prefix, delimiter="/")
    return [b for b in blobs if not b.name.endswith("/")]


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def pull(model: str) -> Source:
    """Step 1: the model's config and tokenizer files, local (pulled from the object store when remote)."""
    if not is_object_uri(model):
        return Source(model, Path(model), remote=False)
    directory = Path(tempfile.mkdtemp(prefix="vllm-standin-"))
    for blob in _gcs_objects(model):
        name = blob.name.rsplit("/", 1)[-1]
        if not _matches(name, WEIGHT_PATTERNS):  # config files, then the tokenizer (model == tokenizer)
            blob.download_to_filename(str(directory / name))
    return Source(model, directory, remote=True)


def read_config(source: Source) -> dict[str, Any]:
    """Step 2: config.json, or vLLM's refusal naming the directory it looked in."""
    path = source.directory / "config.json"
    if not path.is_file():
        raise VllmStartupError(
            "ValueError",
            f"Invalid repository ID or local directory specified: '{source.directory}'.\n"
            "Please verify the following requirements:\n1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.\n"
            "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
            "   - For Mistral models: ensure the presence of a 'params.json'.\n",
        )
    return dict(json.loads(path.read_text()))


def resolve_load_format(source: Source, load_format: str) -> str:
    """Step 3: an object-store model needs the streamer (auto becomes it)."""
    if not source.remote:
        return load_format
    if load_format == "auto":
        print("INFO Detected Run:ai model config. Overriding `load_format` to 'runai_streamer'", flush=True)
        return "runai_streamer"
    if load_format not in STREAMER_FORMATS:
        raise VllmStartupError(
            "ValueError",
            "To load a model from S3, 'load_format' must be 'runai_streamer' or 'runai_streamer_sharded', "
            f"but got '{load_format}'. Model: {source.directory}",
        )
    return load_format


def max_model_len(hf_config: dict[str, Any], requested: int | None) -> int:
    """Step 4: the context length vLLM serves with."""
    derived = int(hf_config["max_position_embeddings"])
    if requested is None:
        return derived
    if requested > derived and os.environ.get(LONG_LEN_ENV, "").strip().lower() not in ("1", "true"):
        raise VllmStartupError(
            "pydantic_core._pydantic_core.ValidationError",
            "1 validation error for ModelConfig\n  Value error, User-specified max_model_len "
            f"({requested}) is greater than the derived max_model_len (max_position_embeddings={derived} or "
            "model_max_length=None in model's config.json). To allow overriding this maximum, set the env var "
            f"{LONG_LEN_ENV}=1. {LONG_LEN_ENV} must be used with extreme caution. If the model uses relative "
            "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses "
            "absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA array "
            "out-of-bounds error.",
        )
    return requested


def check_architecture(hf_config: dict[str, Any]) -> None:
    """Step 5: the one architecture the stand-in implements (vLLM's message for an architecture it lacks)."""
    archs = list(hf_config.get("architectures") or [])
    if ARCHITECTURE not in archs:
        raise VllmStartupError(
            "ValueError",
            f"Model architectures {archs} are not supported for now. Supported architectures: "
            f"dict_keys(['{ARCHITECTURE}']) (the stand-in implements only {ARCHITECTURE}; vLLM has more)",
        )


def _weight_files(source: Source, load_format: str) -> list[tuple[str, bytes]]:
    """Step 6a: the loader's weight files, by name, with their bytes."""
    if load_format not in LOAD_FORMATS:
        raise VllmStartupError("ValueError", f"Load format `{load_format}` is not supported")
    if load_format not in EMULATED_FORMATS:
        raise VllmStartupError("NotImplementedError", f"the stand-in does not emulate --load-format {load_format}")
    patterns = ("*.bin", "*.pt") if load_format in ("pt", "npcache") else ("*.safetensors",)
    if source.remote:
        found = [(b.name.rsplit("/", 1)[-1], b) for b in _gcs_objects(source.model)]
        files = [(name, blob.download_as_bytes()) for name, blob in sorted(found) if _matches(name, patterns)]
    else:
        paths = sorted(p for p in source.directory.iterdir() if p.is_file() and _matches(p.name, patterns))
        files = [(p.name, p.read_bytes()) for p in paths]
    if not files:
        kind = "safetensors model weights" if load_format == "runai_streamer" else "model weights"
        raise VllmStartupError("RuntimeError", f"Cannot find any {kind} with `{source.model}`")
    if load_format in ("pt", "npcache"):  # the export is safetensors only: pytorch bins are not emulated
        raise VllmStartupError("NotImplementedError", "the stand-in reads safetensors weights only")
    return files


def _torch_size(shape: tuple[int, ...]) -> str:
    return f"torch.Size({list(shape)})"


def check_tensors(weights: dict[str, np.ndarray], expected: dict[str, tuple[int, ...]]) -> None:
    """Step 6b: what LlamaForCausalLM.load_weights refuses: an unknown name, a wrong shape, a missing tensor."""
    for name in sorted(weights):
        if name not in expected:
            raise VllmStartupError("KeyError", repr(name))
        if tuple(weights[name].shape) != expected[name]:
            raise VllmStartupError(
                "AssertionError",
                f"Attempted to load weight ({_torch_size(tuple(weights[name].shape))}) into parameter "
                f"({_torch_size(expected[name])})",
            )
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise VllmStartupError("ValueError", f"Following weights were not initialized from checkpoint: {set(missing)}")


def read_weights(source: Source, load_format: str) -> tuple[dict[str, np.ndarray], str]:
    """Step 6: the tensors of every weight file, and the sha256 of those files' bytes in name order."""
    from safetensors.numpy import load

    digest = hashlib.sha256()
    weights: dict[str, np.ndarray] = {}
    for _name, data in _weight_files(source, load_format):
        digest.update(data)
        weights.update(load(data))
    return weights, digest.hexdigest()
