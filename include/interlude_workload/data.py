"""The reference trainer's text, locally or from GCS: the pre-training corpus, or one day's fine-tuning slice.

The data lives in ``include/data/`` of the repository (found automatically in an editable install) or wherever
``--data-dir`` / ``INTERLUDE_DATA_DIR`` points, including ``gs://bucket/prefix`` for machines that only have the
installed package. A data directory holds ``corpus.txt`` (one document per line) and, per day, ``finetune/
YYYY-MM-DD.txt``. The shipped sample has no day files: its days are generated (``llm.corpus.finetune_text``,
seeded by the date alone, so a daily schedule and a backfill over any range find the same slice on every
machine and retry); a real dataset is never synthesised, and a missing day there is an error before anything
is provisioned (``interlude.training.tasks.resolve_run`` asks :func:`load_text` first).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from interlude_workload.gcs import storage_client
from interlude_workload.llm import corpus

CORPUS_FILE = "corpus.txt"
FINETUNE_DIR = "finetune"
DATA_ENV = "INTERLUDE_DATA_DIR"

SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data"


def default_data_dir() -> str:
    return os.environ.get(DATA_ENV) or str(SAMPLE_DIR)


def is_shipped_sample(data_dir: str) -> bool:
    """The repository's own sample (the embedded default), whose days are generated."""
    return not data_dir.startswith("gs://") and Path(data_dir).resolve() == SAMPLE_DIR


def _read_text(data_dir: str, name: str) -> str | None:
    """The file's text; None when it is not there (any other failure raises)."""
    if data_dir.startswith("gs://"):
        bucket, _, prefix = data_dir[len("gs://") :].partition("/")
        path = f"{prefix.rstrip('/')}/{name}" if prefix else name
        blob = storage_client().bucket(bucket).blob(path)
        from google.api_core.exceptions import NotFound

        try:
            return blob.download_as_bytes().decode("utf-8")
        except NotFound:
            return None
    file = Path(data_dir) / name
    return file.read_text(encoding="utf-8") if file.is_file() else None


def load_text(data_dir: str, stage: str, data_date: str | None = None) -> str:
    """The corpus for ``train``; ``data_date``'s slice for any other stage. Raises ValueError naming what is missing."""
    if stage == "train" or not data_date:
        text = _read_text(data_dir, CORPUS_FILE)
        if text is None:
            raise ValueError(f"{data_dir} has no {CORPUS_FILE}")
    elif is_shipped_sample(data_dir):
        text = corpus.finetune_text(data_date)
    else:
        name = f"{FINETUNE_DIR}/{corpus.check_day(data_date)}.txt"
        text = _read_text(data_dir, name)
        if text is None:
            raise ValueError(f"{data_dir} has no {name} (no fine-tuning text dated {data_date})")
    if not text.strip():
        raise ValueError(f"{data_dir}: the {stage} text is empty")
    return text


def load_tokens(data_dir: str, stage: str, data_date: str | None = None) -> np.ndarray:
    """:func:`load_text` as the model's token stream (the shipped tokenizer; each line a document)."""
    from interlude_workload.llm import tokenizer

    return tokenizer.encode_text(tokenizer.load_tokenizer(), load_text(data_dir, stage, data_date))
