"""Where the seconds of two scheduled maintenance events go (issue 16, item 2): the same training uninterrupted,
through two events under Interlude, and through the same two events with periodic checkpoints only, side by side.

Starts the local cloud (the default scenario at ``--time-scale``) and a SQLite Airflow home, then runs three rows
on the TPU node the lifecycle DAG chooses there (v6e-8):

- ``uninterrupted``: the lifecycle DAG (``airflow dags test``), no maintenance;
- ``interlude``: the lifecycle DAG; at two steps of training Google announces a SCHEDULED host maintenance
  (``--notice`` Google-seconds ahead) on the run's node (the local cloud's admin API). Interlude handles it
  as it does by default (``maintenance_policy=by_notice``): train on, checkpoint before the window, start it
  early when Google allows, wait out the restart, check the resume;
- ``naive``: the same node and trainer without Interlude: the benchmark creates the node itself (TPU API) with a
  startup script that runs the reference trainer with ``--periodic-only`` (periodic checkpoints only: no
  notice watch, no control-plane requests, SIGTERM ends the process). The machine reboots after each
  maintenance and resumes from its latest periodic checkpoint, as any careful user's startup script would.

Figures come from the workload's own stamped lines (its log in GCS merged with the node's serial console), the
checkpoints in GCS and the local cloud's own event log; the DAG rows' report (interlude.training.badput on the timeline
Interlude recorded) is printed beside them. The training span is the train stage's first step to its final
commit; "overhead per event" is the span beyond the uninterrupted one minus the cloud's downtime (maintenance
start to end), per event. Seconds are real seconds on this machine (multiply by the time scale for Google's).

    .venv/bin/python benchmarks/badput.py                 # ~3-4 min: 2,000 steps per row
    .venv/bin/python benchmarks/badput.py --json          # the figures as JSON too
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.badput_facts import RunFacts, run_facts  # noqa: E402
from benchmarks.badput_table import figures, table  # noqa: E402
from interlude import naming  # noqa: E402
from interlude_dev import scenario  # noqa: E402
from interlude_dev import wiring as dev  # noqa: E402

DAG_ID = "interlude_training"
BUCKET = "interlude-bench-badput"
ROWS = ("uninterrupted", "interlude", "naive")
ZONE = "us-central1-a"
DEFAULT_ACCELERATOR = "v6e-8"  # what the lifecycle DAG chooses in the default scenario


@dataclass
class Row:
    name: str
    wall_s: float
    run_key: str
    machine_id: str
    accelerator: str
    facts: RunFacts
    gcs_final_step: int
    report: dict[str, Any] | None = None
    announced: list[float] = field(default_factory=list)


def write_scenario(path: Path, time_scale: float) -> Path:
    return scenario.build(path, "default", {"time_scale": time_scale})


def announce_at(cloud: dev.LocalCloud, steps: list[int], notice: float, stop: threading.Event) -> list[float]:
    """In the background: when training on the (one) machine of the row passes each step in turn, and the
    machine is READY with no maintenance pending, Google announces a SCHEDULED maintenance ``notice`` ahead.

    Every row runs it, from its start to its end, with no steps in the uninterrupted row: its looks (the cloud's
    machine list and a progress.json GET every 0.1 s) share the two cores with the trainer, so a row without
    them trained on a quieter machine, and that difference showed as the interrupted row's badput "other"."""
    from interlude_workload.checkpoints import CheckpointStore

    announced: list[float] = []

    def loop() -> None:
        client = dev.gcs_client(cloud)
        while not stop.is_set():
            for m in cloud.admin.machines():
                if m["state"] not in ("READY", "RUNNING") or m["maintenance"] is not None:
                    continue
                run_key = m["name"].rsplit("-", 1)[0]
                progress = CheckpointStore(BUCKET, run_key, "train", client=client).read_progress() or {}
                due = len(announced) < len(steps) and int(progress.get("step") or 0) >= steps[len(announced)]
                if progress.get("state") == "running" and due:
                    cloud.admin.maintenance(m["kind"], m["zone"], m["name"], "SCHEDULED", notice)
                    announced.append(time.time())
            stop.wait(0.1)

    threading.Thread(target=loop, daemon=True).start()
    return announced


def keep_serial_logs(cloud: dev.LocalCloud, dest: Path, stop: threading.Event) -> None:
    """In the background: copy each machine's serial console (startup script, agent and trainer output, all boots)
    beside the other logs while it exists; the local cloud removes a machine's disk when it is deleted."""

    def loop() -> None:
        while not stop.wait(0.3):
            for m in cloud.admin.machines():
                serial = Path(m["disk_dir"]) / "serial.log"
                partial = dest / f".{m['name']}.serial.log"
                try:  # renamed into place: a reader never sees half a copy
                    partial.write_bytes(serial.read_bytes())
                    partial.replace(dest / f"{m['name']}.serial.log")
                except OSError:
                    continue

    threading.Thread(target=loop, daemon=True).start()


def conf(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "train_steps": args.steps,
        "finetune_steps": args.finetune_steps,
        "checkpoint_every": args.checkpoint_every,
        "step_seconds": args.step_seconds,
        "seed": 7,
        "data_date": "2024-01-15",
        "bucket": BUCKET,
        "poll_seconds": args.poll_seconds,
        "model_size": args.model_size,
    }


def _facts(cloud: dev.LocalCloud, run_key: str, machine_id: str, steps: int) -> tuple[RunFacts, int]:
    """The row's facts from its workload log (GCS and the machine's console) and the cloud's events, which are
    kept beside the Airflow logs."""
    from interlude_workload.checkpoints import CheckpointStore

    store = CheckpointStore(BUCKET, run_key, "train", client=dev.gcs_client(cloud))
    latest = store.latest().checkpoint
    log, events = str(store.read_log()), cloud.admin.events()
    (cloud.state_dir.parent / f"{run_key}.workload.log").write_text(log)
    for serial in cloud.state_dir.parent.glob("*.serial.log"):  # kept by keep_serial_logs
        if machine_id.endswith("-" + serial.name.removesuffix(".serial.log")):
            log += "\n" + serial.read_text(errors="replace")
    (cloud.state_dir.parent / f"{run_key}.cloud-events.json").write_text(json.dumps(events, indent=1))
    return run_facts(log, events, machine_id, steps), latest.step if latest else 0


def _node_of(cloud: dev.LocalCloud, run_key: str) -> tuple[str, str]:
    """(machine id, accelerator type) of the row's TPU node, from the cloud's own create event."""
    creates = [e for e in cloud.admin.events() if e["event"] == "tpu_node_create" and run_key in str(e.get("node"))]
    if not creates:
        raise RuntimeError(f"no TPU node was created for {run_key} (the rows assume the default TPU choice)")
    name = str(creates[-1]["node"])
    return f"tpu-{name.split('/')[3]}-{name.rsplit('/', 1)[-1]}", str(creates[-1]["accelerator"])


def dag_row(name: str, cloud: dev.LocalCloud, env: dict[str, str], args: argparse.Namespace, log: Path) -> Row:
    stop = threading.Event()
    announced = announce_at(cloud, args.event_steps if name == "interlude" else [], args.notice, stop)
    started = time.monotonic()
    result = dev.dags_test(env, DAG_ID, conf(args), log, timeout=args.timeout)
    wall = time.monotonic() - started
    stop.set()
    if not result.succeeded or result.run_id is None:
        raise RuntimeError(f"{name}: the DAG run did not succeed ({result.state}); see {log}")
    run_key = naming.run_key(DAG_ID, result.run_id)
    machine, accelerator = _node_of(cloud, run_key)
    facts, final = _facts(cloud, run_key, machine, args.steps)
    report = dev.read_report(cloud, BUCKET, run_key)
    return Row(name, wall, run_key, machine, accelerator, facts, final, report, announced)


def _tpu(cloud: dev.LocalCloud, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    import httpx

    url = f"{cloud.api_endpoint}/v2/projects/{cloud.project}/locations/{ZONE}/{path}"
    response = httpx.request(method, url, json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def naive_row(cloud: dev.LocalCloud, args: argparse.Namespace, accelerator: str) -> Row:
    """The node and its startup script made by hand: the trainer with periodic checkpoints only, no Interlude."""
    from interlude_localcloud.catalog import runtime_versions_for
    from interlude_workload.checkpoints import CheckpointStore
    from interlude_workload.startup import render

    run_key = f"naive-{int(time.time())}"
    node = f"{run_key}-node"
    script = render(
        bucket=BUCKET,
        run_key=run_key,
        stage="train",
        steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        seed=7,
        step_seconds=args.step_seconds,
        periodic_only=True,
    )
    stop = threading.Event()
    announced = announce_at(cloud, args.event_steps, args.notice, stop)
    started = time.monotonic()
    runtime = runtime_versions_for([accelerator])[0]
    body = {"acceleratorType": accelerator, "runtimeVersion": runtime, "metadata": {"startup-script": script}}
    _tpu(cloud, "POST", f"nodes?nodeId={node}", body)
    store = CheckpointStore(BUCKET, run_key, "train", client=dev.gcs_client(cloud))
    deadline = started + args.timeout
    try:
        while (store.read_progress() or {}).get("state") != "done":
            if time.monotonic() > deadline:
                raise RuntimeError(f"naive: training did not finish in {args.timeout:.0f} s")
            time.sleep(0.2)
        wall = time.monotonic() - started
    finally:
        stop.set()
        _tpu(cloud, "DELETE", f"nodes/{node}")
    machine = f"tpu-{ZONE}-{node}"
    facts, final = _facts(cloud, run_key, machine, args.steps)
    return Row("naive", wall, run_key, machine, accelerator, facts, final, None, announced)


def _wait_for_no_machines(cloud: dev.LocalCloud, timeout: float = 30) -> list[dict[str, Any]]:
    """Deletes take the scenario's delay: what is still there after ``timeout`` was left behind."""
    deadline = time.monotonic() + timeout
    while (left := dev.machines(cloud)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000, help="training steps (the train stage)")
    parser.add_argument("--step-seconds", type=float, default=0.02, help="pacing of each step (real seconds)")
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--model-size", default="small", choices=["small", "tiny"], help="the reference model's size")
    parser.add_argument("--finetune-steps", type=int, default=10, help="fine-tuning steps of the DAG rows")
    parser.add_argument(
        "--event-steps", default="", help="comma-separated steps of the two notices (default 15%%, 55%%)"
    )
    parser.add_argument("--notice", type=float, default=3600.0, help="notice of each maintenance, Google-seconds")
    parser.add_argument("--time-scale", type=float, default=600.0, help="the local cloud's clock (Google s per s)")
    parser.add_argument("--poll-seconds", type=float, default=0.5, help="the DAG rows' trigger poll")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"which rows, in order (of {','.join(ROWS)})")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="per row, real seconds (default 600 + 0.5 per step of --steps and --finetune-steps: a 2,000-step row of "
        "the small model took 515 s at load 10, so a fixed 600 s failed every --steps 5000 run)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, local cloud state)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON (a RESULT line) too")
    args = parser.parse_args(argv)
    steps = args.event_steps or f"{int(args.steps * 0.15)},{int(args.steps * 0.55)}"
    args.event_steps = [int(s) for s in steps.split(",") if s.strip()]
    if args.timeout is None:
        args.timeout = 600.0 + 0.5 * (args.steps + args.finetune_steps)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(args.rows) - set(ROWS)
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}")
    return args


def run_rows(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Row], list[dict[str, Any]]]:
    """Every row in order against one local cloud and one Airflow home; what machines were left at the end."""
    rows: dict[str, Row] = {}
    stopped = threading.Event()
    cloud = dev.start_localcloud(write_scenario(tmp / "scenario.yaml", args.time_scale), tmp / "localcloud")
    try:
        env = dev.airflow_env(tmp / "airflow", cloud)
        dev.ensure_airflow_db(env)
        dev.ensure_bucket(cloud, BUCKET)
        keep_serial_logs(cloud, tmp, stopped)
        for name in args.rows:
            if name == "naive":  # on the accelerator Interlude chose (the default TPU of the default scenario)
                chosen = next((r.accelerator for r in rows.values()), DEFAULT_ACCELERATOR)
                rows[name] = naive_row(cloud, args, chosen)
            else:
                rows[name] = dag_row(name, cloud, env, args, tmp / f"{name}.log")
            print(f"{name}: done in {rows[name].wall_s:.0f} s ({rows[name].run_key})", file=sys.stderr, flush=True)
        return rows, _wait_for_no_machines(cloud)
    finally:
        stopped.set()
        cloud.stop()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="interlude-badput-bench-"))
    keep = args.keep
    try:
        rows, left = run_rows(args, tmp)
    except BaseException:
        keep = True  # the Airflow and workload logs say why
        raise
    finally:
        if keep:
            print(f"state kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    step_seconds = rows["uninterrupted"].facts.span_s / args.steps if "uninterrupted" in rows else args.step_seconds
    figs = figures({n: (r.facts, r.gcs_final_step, r.wall_s, r.report) for n, r in rows.items()}, step_seconds)
    print(table(figs, args, {r.accelerator for r in rows.values()}))
    if left:
        print(f"machines left on the local cloud: {[m['name'] for m in left]}")
    if args.json:
        print("RESULT " + json.dumps({"args": vars(args), "rows": figs}))
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
