"""The train state resumes bit for bit in a new process, batches follow the state, a day's fine-tune shows the day."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from interlude_workload.llm import corpus, model, train_step
from interlude_workload.llm.tokenizer import encode_text

RESUME_STEPS = 6
FINETUNE_STEPS = 40

# A new process: restore the state from plain numpy arrays (the shape an Orbax restore gives), finish the run.
_RESUME = """
import sys, numpy as np
from interlude_workload.llm import train_step as ts
from interlude_workload.llm.corpus import load_corpus
from interlude_workload.llm.tokenizer import encode_text, load_tokenizer
arrays = dict(np.load(sys.argv[1]))
state = ts.state_from_arrays(ts.abstract_state(), arrays)
data = ts.prepare_data(encode_text(load_tokenizer(), load_corpus()))
for _ in range(int(sys.argv[2])):
    state, loss = ts.train_step(state, data)
print(ts.params_digest(state["params"]), ts.params_digest(state), int(state["step"]))
"""


def test_resume_from_numpy_arrays_in_a_new_process_is_bit_identical(corpus_data: Any, tmp_path: Path) -> None:
    state = train_step.init_state(seed=3)
    half = RESUME_STEPS // 2
    for step in range(RESUME_STEPS):
        if step == half:
            np.savez(tmp_path / "state.npz", **train_step.state_arrays(state))
        state, _loss = train_step.train_step(state, corpus_data)
    done = subprocess.run(
        [sys.executable, "-c", _RESUME, str(tmp_path / "state.npz"), str(RESUME_STEPS - half)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    params_sha, state_sha, step = done.stdout.split()
    assert int(step) == RESUME_STEPS == int(state["step"])
    assert params_sha == train_step.params_digest(state["params"])
    assert state_sha == train_step.params_digest(state)  # optimizer moments and count too


def test_batches_are_windows_of_the_data_chosen_by_key_and_step(corpus_data: Any) -> None:
    state = train_step.init_state(seed=0)
    inputs, targets = (np.asarray(a) for a in train_step.batch_for(state, corpus_data))
    again, _ = train_step.batch_for(state, corpus_data)
    assert inputs.shape == targets.shape == (8, 64)
    np.testing.assert_array_equal(inputs, np.asarray(again))
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])  # targets are the next tokens
    stream = np.asarray(corpus_data["tokens"])[: int(corpus_data["length"])].tolist()
    row = inputs[0].tolist()
    assert any(stream[i : i + 64] == row for i in range(len(stream) - 64))  # inside the real tokens, not padding
    nxt, _ = train_step.batch_for({**state, "step": state["step"] + 1}, corpus_data)
    assert not np.array_equal(inputs, np.asarray(nxt))  # the data position moves with the step


def test_training_and_fine_tuning_share_one_compiled_step(pretrained: Any, corpus_data: Any, tok: Any) -> None:
    """The learning rate and the data length are values, not constants: a fine-tune reuses the train program."""
    day = train_step.prepare_data(encode_text(tok, corpus.finetune_text("2024-02-01")))
    finetune = train_step.init_state(seed=1, params=pretrained["params"], learning_rate=1e-3)
    train_step.train_step(pretrained, corpus_data)  # the training program, compiled now if no test did yet
    before = train_step.train_step._cache_size()
    train_step.train_step(finetune, day)
    assert train_step.train_step._cache_size() == before
    lr = finetune["opt_state"][1].hyperparams["learning_rate"]
    assert float(lr) == pytest.approx(1e-3)


def test_data_longer_than_the_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="at most 16 tokens"):
        train_step.prepare_data(np.arange(17), capacity=16)


def test_a_state_of_another_shape_is_refused() -> None:
    arrays = train_step.state_arrays(train_step.init_state(seed=0))
    key = "['params']['norm']"
    arrays[key] = arrays[key][:-1]
    with pytest.raises(ValueError, match="does not fit"):
        train_step.state_from_arrays(train_step.abstract_state(), arrays)


def _answer_log_prob(params: Any, tok: Any, answer: str) -> float:
    """log P(answer | the day prompt) under ``params``: the sum of the answer tokens' log-softmax."""
    import numpy as np

    prompt = tok.encode(corpus.DAY_PROMPT).ids
    ids = tok.encode(corpus.DAY_PROMPT + answer).ids
    assert ids[: len(prompt)] == prompt
    logits = model.padded_logits(params, train_step.DEFAULT_CONFIG, ids).astype(np.float64)
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    return float(sum(log_probs[i - 1, ids[i]] for i in range(len(prompt), len(ids))))


def test_a_days_fine_tune_answers_with_that_day(pretrained: Any, tok: Any) -> None:
    """Two days fine-tuned from one base: each model finds its own day's answer to "Today is" far likelier than the
    other day's (the base finds them alike), and its greedy completion names its year.

    Not the whole greedy string: after 40 steps a 1.7 M-parameter model's greedy answer wobbles with float rounding
    from one CPU to another (on this AMD EPYC 2024-02-01 answered " 2024-01." at 40 and 60 steps, " 2024-02-01." at
    70, 100-120), while the likelihoods are steady: measured at 10-60 steps, own day -0.4 to -3.0 nats, the other
    day -16 to -25, the base -9.7 and -10.8."""
    prompt = tok.encode(corpus.DAY_PROMPT).ids
    days = ("2024-02-01", "2025-11-30")
    base = {day: _answer_log_prob(pretrained["params"], tok, corpus.day_answer(day)) for day in days}
    assert abs(base[days[0]] - base[days[1]]) < 5.0, base  # the base model does not know the day
    for day, other in (days, days[::-1]):
        data = train_step.prepare_data(encode_text(tok, corpus.finetune_text(day)))
        state = train_step.init_state(
            seed=1, params=pretrained["params"], learning_rate=train_step.FINETUNE_LEARNING_RATE
        )
        for _ in range(FINETUNE_STEPS):
            state, _loss = train_step.train_step(state, data)
        own = _answer_log_prob(state["params"], tok, corpus.day_answer(day))
        theirs = _answer_log_prob(state["params"], tok, corpus.day_answer(other))
        assert own > theirs + 10.0 and own > base[day] + 5.0, (day, own, theirs, base)
        answer = tok.decode(model.greedy_generate(state["params"], train_step.DEFAULT_CONFIG, prompt, 12))
        assert answer.startswith(" " + day[:4]), (day, answer)


def test_an_orbax_restore_resumes_on_the_same_compiled_step(corpus_data: Any, tmp_path: Path) -> None:
    """A fresh state saves with Orbax as is, restores into :func:`abstract_state`, and steps on the same program."""
    import orbax.checkpoint as ocp

    fresh = train_step.init_state(seed=2)
    with ocp.CheckpointManager(tmp_path / "ckpt") as manager:
        manager.save(0, args=ocp.args.StandardSave(fresh))
        manager.wait_until_finished()
        restored = manager.restore(0, args=ocp.args.StandardRestore(train_step.abstract_state()))
    assert train_step.params_digest(restored) == train_step.params_digest(fresh)
    straight, straight_loss = train_step.train_step(fresh, corpus_data)
    compiled = train_step.train_step._cache_size()
    after_restore, loss = train_step.train_step(restored, corpus_data)
    assert train_step.train_step._cache_size() == compiled  # no second compile (nor cache entry) for resumes
    assert float(loss) == float(straight_loss)
    assert train_step.params_digest(after_restore) == train_step.params_digest(straight)


def test_the_tiny_size_learns_and_exports_a_model_its_own_config_describes(corpus_data: Any, tmp_path: Path) -> None:
    """The size the test suites train: the same architecture, narrower; its loss falls and its export verifies
    (numpy forward of the written files against the JAX model) and names the tiny shapes, not the default's."""
    import json

    from interlude_workload.llm import export, tokenizer
    from interlude_workload.llm.config import LlamaConfig

    tiny = train_step.SIZES["tiny"]
    state = train_step.init_state(tiny.config, 0, hparams=tiny.hparams)
    losses = []
    for _ in range(60):
        state, loss = train_step.train_step(state, corpus_data, tiny.config, tiny.hparams)
        losses.append(float(loss))
    assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.5, losses
    export.export_hf(state["params"], tiny.config, tokenizer.SHIPPED_DIR, tmp_path)
    written = LlamaConfig.from_hf_config(json.loads((tmp_path / "config.json").read_text()))
    assert written == tiny.config != train_step.DEFAULT_CONFIG
    with pytest.raises(ValueError, match="unknown model size 'huge'"):
        train_step.size("huge")
