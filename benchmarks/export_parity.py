"""Parity of an Interlude export with the real loaders: Hugging Face transformers (PyTorch) and, if installed, vLLM.

Standalone: it needs the export directory and this file, nothing of Interlude, so it can be copied to a
machine that has torch (a GPU machine usually does) or vLLM::

    python export_parity.py EXPORT_DIR [--max-new-tokens 16] [--vllm-arg load_format=safetensors ...]
    gcloud storage cp -r gs://BUCKET/interlude/RUN/finetune/export-step-N ./export   # an export in GCS

For each prompt of the export's ``interlude_reference.json`` (written and verified by the export: the
prompt's token ids, the JAX model's last-position logits and greedy tokens) it compares, per loader:

* ``numpy``: the forward carried below (numpy + safetensors, the stand-in's computation);
* ``transformers``: ``AutoModelForCausalLM.from_pretrained(dir)`` in float32 on CPU, ``generate`` greedy;
* ``vllm``: ``vllm.LLM(model=dir, ...)``, temperature 0, with the logprobs of the first generated token.

Columns: the loader's greedy text, whether its tokens equal the JAX model's, the largest |difference| of
its last-position logits from the JAX model's (vLLM: of log-probabilities, over the tokens it returns),
and, for transformers, over every prompt position against the numpy forward. Exit 0 when every loader
that ran agrees (tokens equal; float32 logits within ``--tolerance``), 1 otherwise, 2 on a bad export;
without torch it prints "skipped: torch not installed" after the numpy row and exits 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REFERENCE_FILE = "interlude_reference.json"
EOS_FALLBACK = 1


# --- the numpy forward (the same computation as the stand-in's; kept inline so this file stands alone) ---


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * (x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + np.float32(eps)))


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _attention(w: dict[str, np.ndarray], p: str, h: np.ndarray, rope: tuple[np.ndarray, np.ndarray], c: dict) -> Any:
    t, d = h.shape[0], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(t, nh, d).transpose(1, 0, 2)
    k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(t, nkv, d).transpose(1, 0, 2)
    v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(t, nkv, d).transpose(1, 0, 2)
    cos, sin = rope
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    k, v = np.repeat(k, nh // nkv, axis=0), np.repeat(v, nh // nkv, axis=0)
    s = (q @ k.transpose(0, 2, 1)) / np.float32(np.sqrt(d))
    s = np.where(np.tril(np.ones((t, t), dtype=bool)), s, np.finfo(np.float32).min)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out = ((e / e.sum(axis=-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(t, nh * d)
    return out @ w[p + "self_attn.o_proj.weight"].T


def numpy_logits(w: dict[str, np.ndarray], c: dict, ids: list[int]) -> np.ndarray:
    """Logits [T, V] of a Llama ``config.json`` + safetensors, float32, as LlamaForCausalLM computes them."""
    d, eps = c["head_dim"], c["rms_norm_eps"]
    theta = c.get("rope_theta") or c.get("rope_parameters", {}).get("rope_theta", 10000.0)
    inv = (1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float32) / d))).astype(np.float32)
    freqs = np.arange(len(ids), dtype=np.float32)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    rope = (np.cos(emb), np.sin(emb))
    x = w["model.embed_tokens.weight"][np.asarray(ids)].astype(np.float32)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        x = x + _attention(w, p, _rms_norm(x, w[p + "input_layernorm.weight"], eps), rope, c)
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return _rms_norm(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def numpy_greedy(w: dict[str, np.ndarray], c: dict, ids: list[int], n: int, eos: int) -> list[int]:
    ids, new = list(ids), []
    for _ in range(n):
        nxt = int(np.argmax(numpy_logits(w, c, ids)[-1]))
        new.append(nxt)
        ids.append(nxt)
        if nxt == eos:
            break
    return new


# --- the loaders -------------------------------------------------------------------------------------------


def _strip_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else list(tokens)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - (np.log(np.sum(np.exp(x - x.max()))) + x.max())


def run_numpy(export: Path, ref: dict, config: dict, n: int, eos: int) -> list[dict]:
    from safetensors.numpy import load_file

    w = load_file(str(export / "model.safetensors"))
    rows = []
    for p in ref["prompts"]:
        logits = numpy_logits(w, config, p["token_ids"])
        rows.append({"tokens": numpy_greedy(w, config, p["token_ids"], n, eos), "last": logits[-1], "all": logits})
    return rows


def run_transformers(export: Path, ref: dict, n: int, eos: int) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(export))
    model = AutoModelForCausalLM.from_pretrained(str(export), dtype=torch.float32).eval()
    rows = []
    for p in ref["prompts"]:
        if tok(p["text"])["input_ids"] != p["token_ids"]:
            raise SystemExit(f"transformers tokenizes {p['text']!r} differently from the export's reference")
        ids = torch.tensor([p["token_ids"]])
        with torch.no_grad():
            logits = model(ids).logits[0].float().numpy()
            out = model.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=eos)
        rows.append({"tokens": out[0, ids.shape[1] :].tolist(), "last": logits[-1], "all": logits})
    return rows


def run_vllm(export: Path, ref: dict, n: int, extra: dict[str, Any]) -> list[dict]:
    from vllm import LLM, SamplingParams

    kwargs = {"model": str(export), "dtype": "float32", "max_model_len": 256, "enforce_eager": True, **extra}
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=n, logprobs=20)
    outs = llm.generate([{"prompt_token_ids": p["token_ids"]} for p in ref["prompts"]], params)
    rows = []
    for out in outs:
        first = out.outputs[0].logprobs[0] if out.outputs[0].logprobs else {}
        rows.append({"tokens": list(out.outputs[0].token_ids), "logprobs": {k: v.logprob for k, v in first.items()}})
    return rows


# --- the table ---------------------------------------------------------------------------------------------


def compare(name: str, rows: list[dict], ref: dict, eos: int, numpy_rows: list[dict] | None) -> list[dict]:
    """One table row per prompt: tokens equal to JAX's, last-position logit (or logprob) gap, all-position gap."""
    table = []
    for i, (p, row) in enumerate(zip(ref["prompts"], rows, strict=True)):
        jax_last = np.asarray(p["jax_last_logits"], dtype=np.float64)
        if "last" in row:
            gap = float(np.max(np.abs(row["last"] - jax_last)))
        else:  # vLLM: log-probabilities of the tokens it returned, against log_softmax of the JAX logits
            ls = _log_softmax(jax_last)
            gap = max((abs(lp - ls[t]) for t, lp in row["logprobs"].items()), default=float("nan"))
        all_gap = None
        if numpy_rows is not None and "all" in row and name != "numpy":
            all_gap = float(np.max(np.abs(row["all"] - numpy_rows[i]["all"])))
        same = _strip_eos(row["tokens"], eos) == _strip_eos(p["greedy_token_ids"], eos)
        table.append(
            {"loader": name, "prompt": p["text"], "tokens": row["tokens"], "same": same, "gap": gap, "all_gap": all_gap}
        )
    return table


def print_table(table: list[dict], decode: Any) -> None:
    head = (
        f"{'loader':<13} {'prompt':<28} {'greedy completion':<30} {'=JAX':<5} {'max|dlogit| last':>16} {'vs numpy':>10}"
    )
    print(head)
    print("-" * len(head))
    for r in table:
        all_gap = "" if r["all_gap"] is None else f"{r['all_gap']:.2e}"
        text = repr(decode(r["tokens"]))[:30]
        print(
            f"{r['loader']:<13} {r['prompt']!r:<28} {text:<30} {'yes' if r['same'] else 'NO':<5} "
            f"{r['gap']:>16.2e} {all_gap:>10}"
        )


def _decoder(export: Path) -> Any:
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(export / "tokenizer.json"))
        return lambda ids: tok.decode(ids)
    except ImportError:
        return lambda ids: " ".join(map(str, ids))


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _load(export: Path) -> tuple[dict, dict]:
    try:
        ref = json.loads((export / REFERENCE_FILE).read_text())
        config = json.loads((export / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"not a verified Interlude export: {exc}") from exc
    return ref, config


def _vllm_args(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("export_dir", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: the reference's")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="float32 logits vs JAX (default 1e-4)")
    parser.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra vllm.LLM keyword (JSON value), e.g. load_format=runai_streamer dtype=bfloat16",
    )
    parser.add_argument("--json", action="store_true", help="also print the rows as one JSON line")
    args = parser.parse_args(argv)
    try:
        ref, config = _load(args.export_dir)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    n = args.max_new_tokens or ref["max_new_tokens"]
    eos = config.get("eos_token_id", EOS_FALLBACK)
    table: list[dict] = []
    numpy_rows = run_numpy(args.export_dir, ref, config, n, eos) if _has("safetensors") else None
    if numpy_rows is not None:
        table += compare("numpy", numpy_rows, ref, eos, None)
    strict = {"numpy", "transformers"}
    if not _has("torch"):
        print_table(table, _decoder(args.export_dir))
        print("skipped: torch not installed (transformers' AutoModelForCausalLM needs it); numpy rows only")
        return 0 if all(r["same"] and r["gap"] <= args.tolerance for r in table) else 1
    table += compare("transformers", run_transformers(args.export_dir, ref, n, eos), ref, eos, numpy_rows)
    vllm_extra = _vllm_args(args.vllm_arg)
    if _has("vllm"):
        table += compare("vllm", run_vllm(args.export_dir, ref, n, vllm_extra), ref, eos, None)
        if vllm_extra.get("dtype", "float32") == "float32":
            strict.add("vllm")
    else:
        print("vllm: skipped (not installed)")
    print_table(table, _decoder(args.export_dir))
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "tokens"} for r in table]))
    bad = [r for r in table if not r["same"] or (r["loader"] in strict and not r["gap"] <= args.tolerance)]
    print(f"{len(table) - len(bad)} rows agree, {len(bad)} differ (tolerance {args.tolerance:g} for float32 loaders)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
