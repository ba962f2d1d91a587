"""Generate the reference workload's small, deterministic datasets (run once; the CSVs are committed).

    python include/data/generate_data.py            # rewrites train.csv and finetune.csv next to it

train.csv: 1,200 rows of 8 features and a label in 3 classes (Gaussian blobs pushed through a fixed
non-linear mix, so a 2-layer MLP beats a linear model). finetune.csv: the same task drifting slowly
over 2024-01-01..2024-03-31, 16 rows a day with a ``date`` column, so each backfilled Airflow run
(data interval start = one day) fine-tunes on its own day's slice.
"""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np

from interlude_workload.synthetic import FEATURES, SEED, sample

HERE = Path(__file__).resolve().parent
_sample = sample


def _write(path: Path, x: np.ndarray, y: np.ndarray, dates: list[str] | None) -> None:
    header = ([] if dates is None else ["date"]) + [f"f{i}" for i in range(FEATURES)] + ["label"]
    lines = [",".join(header)]
    for i in range(len(y)):
        row = ([] if dates is None else [dates[i]]) + [f"{v:.4f}" for v in x[i]] + [str(int(y[i]))]
        lines.append(",".join(row))
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    rng = np.random.default_rng(SEED)
    x, y = _sample(rng, 1200, shift=0.0)
    _write(HERE / "train.csv", x, y, None)
    xs, ys, ds = [], [], []
    day = date(2024, 1, 1)
    while day <= date(2024, 3, 31):
        offset = (day - date(2024, 1, 1)).days
        xd, yd = _sample(rng, 16, shift=0.02 * offset)
        xs.append(xd)
        ys.append(yd)
        ds += [day.isoformat()] * 16
        day += timedelta(days=1)
    _write(HERE / "finetune.csv", np.concatenate(xs), np.concatenate(ys), ds)


if __name__ == "__main__":
    main()
