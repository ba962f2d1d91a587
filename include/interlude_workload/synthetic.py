"""The reference task's data generator: the shipped CSVs came from it, and any other day's slice does too.

Why generate: a daily schedule and backfills over any range must find a fine-tuning slice for their
date on the embedded default, but shipping years of CSV rows would be silly. Days the shipped sample
covers (2024-01-01..2024-03-31) are read from finetune.csv; any other day is generated here from a
seed derived from the date alone, so a day's slice is the same on every machine and every retry.
A real dataset plugs in through ``INTERLUDE_DATA_DIR`` (see data.py) and is never synthesized.
"""

from __future__ import annotations

from datetime import date

import numpy as np

FEATURES = 8
CLASSES = 3
SEED = 20240101
ROWS_PER_DAY = 16
EPOCH = date(2024, 1, 1)
DRIFT_PERIOD_DAYS = 91
"""The sample's drift (a slowly moving class centre) repeats every quarter, so far-off days stay learnable."""


def sample(rng: np.random.Generator, n: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """n rows of the task: Gaussian blobs pushed through a fixed non-linear mix, first centre moved by shift."""
    centers = np.random.default_rng(7).normal(0.0, 1.6, size=(CLASSES, FEATURES))
    centers[:, 0] += shift
    labels = rng.integers(0, CLASSES, size=n)
    x = centers[labels] + rng.normal(0.0, 1.0, size=(n, FEATURES))
    mix = np.random.default_rng(11).normal(0.0, 0.5, size=(FEATURES, FEATURES))
    x = np.tanh(x @ mix) * 2.0 + 0.1 * x
    return x, labels


def day_slice(day: str) -> tuple[np.ndarray, np.ndarray]:
    """One day's fine-tuning rows, rounded as the CSV rounds them (4 decimals), from the date alone."""
    when = date.fromisoformat(day)
    offset = (when - EPOCH).days
    rng = np.random.default_rng([SEED, when.toordinal()])
    x, y = sample(rng, ROWS_PER_DAY, shift=0.02 * (offset % DRIFT_PERIOD_DAYS))
    return np.round(x, 4), y.astype(np.int64)
