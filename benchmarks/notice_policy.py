"""What does an hour's maintenance notice cost a GPU training run: the policy by notice length against
checkpoint-at-notice (issue 15), side by side, in one run.

Starts the local cloud (the default scenario at 600x: a GPU VM's hour of notice is 6 s, its 5-minute
host maintenance 0.5 s) and a SQLite Airflow home, then runs the lifecycle DAG (`airflow dags test`)
once per policy; at step 20 of training Google announces a SCHEDULED maintenance on the run's VM. The
figures come from the workload's own log and the local cloud's event log (interlude_dev.notice_runs, the runs
tests/faults/test_notice_policy.py asserts on): how long it trained on after the notice, how long before the
window its last checkpoint committed, idle seconds (stopped stepping -> stepping again on the new boot) and
lost seconds (idle + recomputed steps). Seconds are real seconds on this machine; multiply by the time
scale for Google's.

    .venv/bin/python benchmarks/notice_policy.py            # ~2-4 min on a loaded 2-core machine
    .venv/bin/python benchmarks/notice_policy.py --json     # the figures as JSON too
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from interlude_dev import wiring as dev
from interlude_dev.notice_runs import TIME_SCALE, NoticeFigures, run_with_notice, write_scenario

BUCKET = "interlude-bench-notice"
POLICIES = ("by_notice", "checkpoint_at_notice")
ROWS = (
    ("trained after the notice (s)", "trained_after_notice_s"),
    ("step at the notice", "notice_step"),
    ("step it stopped at", "stopped_step"),
    ("last commit before the window (step)", "last_commit_before_window"),
    ("... committed this long before it (s)", "committed_before_window_s"),
    ("resumed from step", "resume_step"),
    ("steps recomputed", "recomputed_steps"),
    ("idle: not stepping (s)", "idle_s"),
    ("lost: idle + recomputed (s)", "lost_s"),
)


def table(results: dict[str, NoticeFigures]) -> str:
    width = max(len(label) for label, _ in ROWS)
    lines = [f"{'':<{width}}  " + "  ".join(f"{p:>20}" for p in POLICIES)]
    for label, key in ROWS:
        lines.append(f"{label:<{width}}  " + "  ".join(f"{getattr(results[p], key):>20}" for p in POLICIES))
    saved = results["checkpoint_at_notice"].lost_s - results["by_notice"].lost_s
    lines.append(
        f"\nby_notice saves {saved:.1f} s of {results['checkpoint_at_notice'].lost_s:.1f} s lost per notice "
        f"(about {saved * TIME_SCALE / 60:.0f} Google-minutes at the scenario's {TIME_SCALE}x clock)"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON as well")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="interlude-notice-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        cloud = dev.start_localcloud(write_scenario(tmp / "scenario.yaml"), tmp / "localcloud")
        try:
            env = dev.airflow_env(tmp / "airflow", cloud)
            dev.ensure_airflow_db(env)
            dev.ensure_bucket(cloud, BUCKET)
            results: dict[str, NoticeFigures] = {}
            for policy in POLICIES:
                result, run_key, figures = run_with_notice(cloud, env, BUCKET, policy, tmp / f"{policy}.log")
                if not result.succeeded or figures is None:
                    print(f"{policy}: run {run_key} did not go as planned; see {tmp / policy}.log", file=sys.stderr)
                    return 1
                results[policy] = figures
                print(f"{policy}: done ({run_key})", file=sys.stderr)
        finally:
            cloud.stop()
    print(table(results))
    if args.json:
        print(json.dumps({p: f.to_dict() for p, f in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
