"""Run naming is a compatibility promise: validity, stability and distinctness over arbitrary ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# Pinned outputs: if one of these changes, existing runs lose their checkpoints.
from interlude import naming

PINNED = [
    ("interlude_training", "manual__2026-12-02T10:47:26.123456+00:00"),
    ("interlude_training", "backfill__2026-11-01T00:00:00+00:00"),
    ("x", "scheduled__2026-01-01T00:00:00+00:00"),
    ("9lives", "---"),
]

ids = st.text(min_size=1, max_size=250)
backfillish = st.builds(
    lambda d, h, s: f"backfill__2026-{d:02d}-01T{h:02d}:{s:02d}:00+00:00",
    st.integers(1, 12),
    st.integers(0, 23),
    st.integers(0, 59),
)


def test_pinned_values_never_change() -> None:
    got = [naming.run_key(d, r) for d, r in PINNED]
    assert got == [
        "interlude-training-manual-202-meacjtbyuv",
        "interlude-training-backfill-2-fmsuam6cyh",
        "x-scheduled-2026-01-01t00-00-ca3hjf4h4i",
        "r-9lives-op66rzopbk",
    ]


@settings(max_examples=500)
@given(dag_id=ids, run_id=st.one_of(ids, backfillish))
def test_run_key_is_valid_and_stable(dag_id: str, run_id: str) -> None:
    key = naming.run_key(dag_id, run_id)
    assert len(key) <= naming.RUN_KEY_MAX
    assert naming.NAME_RE.match(key), key
    assert key == naming.run_key(dag_id, run_id)
    for role in ("tpu", "vm", "qr", "train-worker-0"):
        name = naming.resource_name(key, role)
        assert len(name) <= naming.NAME_MAX and naming.NAME_RE.match(name)
    for value in naming.labels(key, dag_id, "finetune").values():
        assert naming.LABEL_VALUE_RE.match(value), value


def test_no_collisions_in_a_large_sample() -> None:
    # Ids that differ only in characters the slug folds away, or past the truncation point.
    runs = [
        f"backfill__2026-11-{d:02d}T{h:02d}:00:00{tz}"
        for d in range(1, 29)
        for h in range(24)
        for tz in ("+00:00", "-00:00", "+01:00")
    ]
    runs += [f"manual__{'x' * 80}{i}" for i in range(3000)]
    keys = {naming.run_key("interlude_training", r) for r in runs}
    assert len(keys) == len(runs)


def test_bad_inputs_are_refused_clearly() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        naming.run_key("", "run")
    with pytest.raises(ValueError, match="role"):
        naming.resource_name("abc", "Bad_Role")


def test_checkpoint_prefix() -> None:
    assert naming.checkpoint_prefix("k-1", "train") == "interlude/k-1/train/"
    assert naming.checkpoint_prefix("k-1") == "interlude/k-1/"
