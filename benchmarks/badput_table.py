"""The badput benchmark's figures and side-by-side table: pure, from each row's facts (benchmarks/badput_facts.py),
its final step in GCS, its wall time and its run report (DAG rows)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from benchmarks.badput_facts import RunFacts
from interlude.training.badput import CAUSES

RowInput = tuple[RunFacts, int, float, dict[str, Any] | None]
"""(facts, final committed step in GCS, the row's wall seconds, its run report or None)."""


def figures(rows: dict[str, RowInput], step_seconds: float) -> dict[str, dict[str, Any]]:
    """Per row: the independent figures (log, GCS, cloud) and the report's (DAG rows)."""
    base = rows["uninterrupted"][0].span_s if "uninterrupted" in rows else None
    out: dict[str, dict[str, Any]] = {}
    for name, (f, final_step, wall_s, report) in rows.items():
        n = len(f.events)
        wall, productive, badput = f.badput(step_seconds)
        fig: dict[str, Any] = {
            "wall_s": round(wall_s, 1),
            "steps": final_step,
            "train_span_s": round(f.span_s, 2),
            "events": n,
            "cloud_downtime_s": round(f.downtime_s, 2),
            "steps_recomputed": f.recomputed_steps,
            "goodput": round(productive / wall, 4) if wall else None,
            "badput_s": badput.as_dict(),
            "notice_to_commit_s": [
                None if e.notice_to_commit_s is None else round(e.notice_to_commit_s, 2) for e in f.events
            ],
            "notice_to_first_commit_s": [_round(e.notice_to_first_commit_s) for e in f.events],
            "recomputed_per_event": [e.recomputed_steps for e in f.events],
            "downtime_per_event_s": [round(e.downtime_s, 2) for e in f.events],
        }
        if base is not None and n:
            fig["overhead_per_event_s"] = round((f.span_s - base - f.downtime_s) / n, 2)
            fig["goodput_vs_uninterrupted_downtime_aside"] = round(base / (f.span_s - f.downtime_s), 4)
        if report:
            fig["report"] = {
                "goodput": report["goodput"],
                "wall_s": report["wall_seconds"],
                "events": len(report["events"]),
                "steps_recomputed": report["steps_recomputed"],
                "beyond_downtime_s": [e.get("beyond_downtime_s") for e in report["events"]],
                "badput_s": report["badput_seconds"],
            }
        out[name] = fig
    return out


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"
    if isinstance(value, list):
        return " / ".join(_cell(v) for v in value) or "-"
    return str(value)


def table(figs: dict[str, dict[str, Any]], args: argparse.Namespace, accelerators: set[str]) -> str:
    names = list(figs)
    lines: list[tuple[str, list[Any]]] = [
        ("row wall time (s)", [figs[n]["wall_s"] for n in names]),
        ("final committed step [GCS]", [figs[n]["steps"] for n in names]),
        ("training span: step 1 -> final commit (s) [log]", [figs[n]["train_span_s"] for n in names]),
        ("maintenance events [cloud]", [figs[n]["events"] for n in names]),
        ("cloud downtime, per event (s) [cloud]", [figs[n]["downtime_per_event_s"] for n in names]),
        ("overhead per event beyond the downtime (s)", [figs[n].get("overhead_per_event_s") for n in names]),
        ("notice -> first committed checkpoint (s) [cloud+log]", [figs[n]["notice_to_first_commit_s"] for n in names]),
        ("notice -> committed checkpoint resumed from (s)", [figs[n]["notice_to_commit_s"] for n in names]),
        ("steps recomputed, per event [log]", [figs[n]["recomputed_per_event"] for n in names]),
        (
            "goodput vs uninterrupted, downtime aside",
            [figs[n].get("goodput_vs_uninterrupted_downtime_aside") for n in names],
        ),
        ("goodput of the training span [log+cloud]", [figs[n]["goodput"] for n in names]),
    ]
    lines += [(f"  badput {cause} (s)", [figs[n]["badput_s"][cause] for n in names]) for cause in CAUSES]
    report = [figs[n].get("report") or {} for n in names]
    lines += [
        (
            "report: events / steps recomputed",
            [f"{r['events']} / {r['steps_recomputed']}" if r else None for r in report],
        ),
        ("report: beyond downtime per event (s)", [r.get("beyond_downtime_s") for r in report]),
        (
            "report: goodput of the run (wall s)",
            [f"{r['goodput']:.1%} ({r['wall_s']:.1f})" if r else None for r in report],
        ),
    ]
    lines += [(f"  report badput {cause} (s)", [r.get("badput_s", {}).get(cause) for r in report]) for cause in CAUSES]
    width = max(len(label) for label, _ in lines)
    head = (
        f"Badput benchmark: {args.steps} steps x {args.step_seconds} s, checkpoint every {args.checkpoint_every}, "
        f"events at steps {args.event_steps} with {args.notice:.0f} s notice, time scale {args.time_scale:g}x, "
        f"{os.cpu_count()} cores; TPU {', '.join(sorted(accelerators))}"
    )
    out = [head, f"{'':<{width}}  " + "  ".join(f"{n:>20}" for n in names)]
    out += [f"{label:<{width}}  " + "  ".join(f"{_cell(v):>20}" for v in values) for label, values in lines]
    return "\n".join(out)
