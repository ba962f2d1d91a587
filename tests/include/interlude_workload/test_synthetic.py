"""Any day has a fine-tuning slice on the embedded default; the shipped days still come from the CSV."""

from __future__ import annotations

import numpy as np
import pytest

from interlude_workload import data, synthetic


def test_shipped_days_are_read_from_the_csv() -> None:
    x, y = data.load(data.default_data_dir(), "finetune", "2024-01-15")
    assert x.shape == (16, 8) and y.shape == (16,)


@pytest.mark.parametrize("day", ["2026-12-02", "2023-06-30", "2031-02-28"])
def test_any_other_day_is_generated_the_same_every_time(day: str) -> None:
    x1, y1 = data.load(data.default_data_dir(), "finetune", day)
    x2, y2 = synthetic.day_slice(day)
    assert x1.shape == (synthetic.ROWS_PER_DAY, synthetic.FEATURES)
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert set(y1.tolist()) <= set(range(synthetic.CLASSES))


def test_different_days_differ() -> None:
    assert not np.array_equal(synthetic.day_slice("2026-12-01")[0], synthetic.day_slice("2026-12-02")[0])


def test_a_real_dataset_is_never_synthesized(tmp_path) -> None:
    (tmp_path / "finetune.csv").write_text("date,f0,label\n2024-01-01,0.5,1\n")
    with pytest.raises(ValueError, match="no rows dated 2026-12-02"):
        data.load(str(tmp_path), "finetune", "2026-12-02")
