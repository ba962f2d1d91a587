"""Load the reference workload's shipped CSV data, locally or from GCS, optionally one day's slice.

The data lives in ``include/data/`` of the repository (found automatically in an editable install) or
wherever ``--data-dir`` / ``INTERLUDE_DATA_DIR`` points, including ``gs://bucket/prefix`` for machines
that only have the installed package.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np

from interlude_workload import synthetic
from interlude_workload.gcs import storage_client

TRAIN_FILE = "train.csv"
FINETUNE_FILE = "finetune.csv"
DATA_ENV = "INTERLUDE_DATA_DIR"


SAMPLE_DIR = Path(__file__).resolve().parents[1] / "data"


def default_data_dir() -> str:
    return os.environ.get(DATA_ENV) or str(SAMPLE_DIR)


def is_shipped_sample(data_dir: str) -> bool:
    """The repository's own sample (the embedded default), whose missing days are generated."""
    return not data_dir.startswith("gs://") and Path(data_dir).resolve() == SAMPLE_DIR


def _read_text(data_dir: str, name: str) -> str:
    if data_dir.startswith("gs://"):
        bucket, _, prefix = data_dir[len("gs://") :].partition("/")
        path = f"{prefix.rstrip('/')}/{name}" if prefix else name
        return storage_client().bucket(bucket).blob(path).download_as_bytes().decode("utf-8")
    return (Path(data_dir) / name).read_text()


def load(data_dir: str, stage: str, data_date: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels: train.csv for ``train``, finetune.csv (rows of ``data_date``) otherwise."""
    name = TRAIN_FILE if stage == "train" else FINETUNE_FILE
    rows = list(csv.DictReader(io.StringIO(_read_text(data_dir, name))))
    if stage != "train" and data_date:
        rows = [r for r in rows if r.get("date") == data_date]
        if not rows and is_shipped_sample(data_dir):
            return synthetic.day_slice(data_date)
        if not rows:
            raise ValueError(f"{name} has no rows dated {data_date}")
    if not rows:
        raise ValueError(f"{name} is empty")
    features = sorted((k for k in rows[0] if k.startswith("f")), key=lambda k: int(k[1:]))
    x = np.array([[float(r[k]) for k in features] for r in rows], dtype=np.float64)
    y = np.array([int(r["label"]) for r in rows], dtype=np.int64)
    return x, y
