"""How far two correct float32 forwards of the model drift apart as it trains: the ground for the export's check.

The export (``interlude_workload.llm.export``) compares the numpy forward over the written safetensors with the JAX
forward over the weights in memory. Both are correct; they differ by float32 rounding (another order of sums,
fused ops), which grows with the logits' magnitude, and the logits grow as a model trains. An absolute 1e-5 failed
every run of the default model past a few hundred steps (1.24e-5 .. 1.72e-5). This trains each size through
``--steps`` with the trainer's own step (the train stage, then a fine-tune on one day's slice, as the DAG does) and
prints, at each step of ``--at``, per prompt: the largest |JAX - numpy| logit difference, the largest |logit|,
their ratio, and whether the greedy tokens agree. Then the same against a broken export (one weight off by one
float32 ulp in every tensor, and one layer's weights swapped), so the bound is shown to separate the two::

    .venv/bin/python benchmarks/export_tolerance.py                  # small: train 5,000, fine-tune 200 (~10 min)
    .venv/bin/python benchmarks/export_tolerance.py --sizes tiny --steps 300 --finetune-steps 50

The verdict line says whether every correct row is within the export's bound and every broken row beyond it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # as the trainer runs the check
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402


def _measure(params: Any, config: Any, broken: str | None = None) -> list[dict[str, Any]]:
    from interlude_workload.llm import export, model, numpy_forward, tokenizer

    weights = export.to_hf_tensors(params)
    if broken == "swap":  # a real mistake: two layers' MLP weights exchanged on the way out
        last = config.num_hidden_layers - 1
        a, b = "model.layers.0.mlp.down_proj.weight", f"model.layers.{last}.mlp.up_proj.weight"
        if last == 0:
            b = "model.layers.0.mlp.gate_proj.weight"
        if weights[a].shape == weights[b].shape:
            weights[a], weights[b] = weights[b], weights[a]
        else:
            weights[a] = weights[a][::-1].copy()
    elif broken == "row":  # one row of the output head shifted by one: a subtle off-by-one
        head = weights["lm_head.weight"].copy()
        head[5] = head[6]
        weights["lm_head.weight"] = head
    tok = tokenizer.load_tokenizer(tokenizer.SHIPPED_DIR)
    rows = []
    for text in export.PROMPTS:
        ids = tok.encode(text).ids
        jax_logits = model.padded_logits(params, config, ids)
        np_logits = numpy_forward.forward(weights, config, ids)
        diff = float(np.max(np.abs(np_logits - jax_logits)))
        scale = float(np.max(np.abs(jax_logits)))
        verdict = export.logits_problem(text, jax_logits, np_logits)
        rows.append({"prompt": text, "diff": diff, "scale": scale, "ratio": diff / scale, "refused": verdict})
    return rows


def _size_rows(size: str, args: argparse.Namespace, at: set[int]) -> list[dict[str, Any]]:
    """Train ``size`` as the DAG does (train, then a fine-tune on one day) and measure at the steps of ``at``."""
    from interlude_workload import data, model
    from interlude_workload.llm.train_step import size as model_size

    rows: list[dict[str, Any]] = []
    config = model_size(size).config
    corpus = model.prepare(data.load_tokens(data.default_data_dir(), "train"))
    day = model.prepare(data.load_tokens(data.default_data_dir(), "finetune", args.data_date))
    state = model.new_state("train", 0, None, size)
    for step in range(0, args.steps + 1):
        if step:
            state, _ = model.step(state, corpus, size)
        if step in at or step == args.steps:
            rows += [
                {"size": size, "stage": "train", "step": step, "broken": None, **r}
                for r in _measure(state["params"], config)
            ]
    tuned = model.new_state("finetune", 0, model.params_only(state), size)
    for _ in range(args.finetune_steps):
        tuned, _ = model.step(tuned, day, size)
    for broken in (None, "row", "swap"):
        rows += [
            {"size": size, "stage": "finetune", "step": args.finetune_steps, "broken": broken, **r}
            for r in _measure(tuned["params"], config, broken)
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="small,tiny")
    parser.add_argument("--steps", type=int, default=5000, help="train steps")
    parser.add_argument("--finetune-steps", type=int, default=200)
    parser.add_argument("--at", default="0,200,500,1000,2000,5000", help="train steps to measure at")
    parser.add_argument("--data-date", default="2024-02-01")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from interlude_workload.llm import export

    at = {int(x) for x in args.at.split(",") if x}
    started = time.monotonic()
    results = [row for size in args.sizes.split(",") for row in _size_rows(size, args, at)]
    correct = [r for r in results if r["broken"] is None]
    broken_rows = [r for r in results if r["broken"] is not None]
    by_prompt_broken = {(r["size"], r["broken"]) for r in broken_rows if r["refused"]}
    ok = all(r["refused"] is None for r in correct) and len(by_prompt_broken) == len(
        {(r["size"], r["broken"]) for r in broken_rows}
    )
    if args.json:
        print(json.dumps({"rows": results, "met": ok}, indent=1))
    else:
        print(f"{'size':6} {'stage':9} {'step':>5} {'broken':6} {'prompt':28} {'|diff|':>9} {'max|l|':>8} {'ratio':>9}")
        for r in results:
            print(
                f"{r['size']:6} {r['stage']:9} {r['step']:>5} {r['broken'] or '-':6} {r['prompt']:28} "
                f"{r['diff']:9.2e} {r['scale']:8.2f} {r['ratio']:9.2e}" + ("  REFUSED" if r["refused"] else "")
            )
        worst = max(correct, key=lambda r: r["ratio"])
        print(
            f"worst correct: {worst['size']} {worst['stage']} step {worst['step']}: |diff| {worst['diff']:.3g}, "
            f"max|logit| {worst['scale']:.3g}, ratio {worst['ratio']:.3g} (bound: {export.TOLERANCE_RELATIVE:g} "
            f"x max|logit| + {export.TOLERANCE_ABSOLUTE:g}); {time.monotonic() - started:.0f} s"
        )
    met = "met" if ok else "NOT met"
    print(f"goal: every correct export accepted and every broken one refused: {met}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
