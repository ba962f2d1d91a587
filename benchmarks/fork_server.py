"""A machine's boot with and without the local cloud's fork server (issue 44, item 1): CPU and time from the boot
to the trainer's "training" line, the machine's whole process group counted.

Without it, every boot's ``python -m interlude_workload.agent`` imports JAX, Orbax, tensorstore and the Google
clients again; with it (include/interlude_localcloud/forkserver), the agent is a fork of a process that imported
them once. The boots alternate (off, on, off, on...) through the local cloud's own ``MachineProcess`` and the
rendered agent startup script, each resuming the stage from the checkpoint the last one committed on SIGTERM
(restore_probe.py's setup). The zygote's one start is reported apart: what the forks save is paid back after
the first boot or two.

    .venv/bin/python benchmarks/fork_server.py --boots 6
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from restore_probe import BUCKET, RUN_KEY, TRAINING, _Metadata  # noqa: E402

from interlude_localcloud.forkserver.client import ENABLE_ENV, SHARED_ENV, ForkServer  # noqa: E402
from interlude_localcloud.machines import MachineProcess  # noqa: E402
from interlude_workload.plan import StagePlan, write_plan  # noqa: E402
from interlude_workload.startup import render_agent  # noqa: E402
from interlude_workload.testing import running_gcs_emulator  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
# A machine's boot costs its own work, not the imports (issue 44): the agent and trainer of a forked boot within
# this much CPU up to the training line (an unforked boot measured ~1.7 CPU-s of agent alone in the suite).
GOAL_CPU_S = 1.0


def group_cpu(pgid: int) -> float:
    """utime + stime of every process in a process group, from /proc."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def boot_once(script: str, work: Path, n: int, forked: bool) -> tuple[float, float]:
    """One boot to the training line, then the machine's SIGTERM (the trainer commits). (seconds, CPU-s)."""
    os.environ[ENABLE_ENV] = "1" if forked else "0"
    machine = MachineProcess(f"probe-{n}", work / f"m{n}", {"INTERLUDE_MACHINE_ID": f"probe-{n}"})
    started = time.perf_counter()
    machine.boot(script)
    pid = machine.pid()
    assert pid is not None
    log = machine.disk_dir / "serial.log"
    deadline = time.monotonic() + 600
    while TRAINING not in log.read_text(errors="replace"):
        if not machine.running() or time.monotonic() > deadline:
            raise RuntimeError("no training line:\n" + log.read_text(errors="replace")[-3000:])
        time.sleep(0.01)
    took, cpu = time.perf_counter() - started, group_cpu(pid)
    machine.shutdown(grace=60, reason="probe", block=True)
    return took, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boots", type=int, default=6, help="boots each way")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    load = Path("/proc/loadavg").read_text().split()[:3]
    results: dict[str, list[tuple[float, float]]] = {"cold": [], "forked": []}
    with tempfile.TemporaryDirectory(prefix="fork-probe-") as tmp, running_gcs_emulator() as emulator:
        work = Path(tmp)
        os.environ["STORAGE_EMULATOR_HOST"] = emulator.endpoint
        os.environ["INTERLUDE_METADATA_URL"] = f"http://127.0.0.1:{server.server_address[1]}/computeMetadata/v1"
        emulator.create_bucket(BUCKET)
        write_plan(BUCKET, RUN_KEY, StagePlan(order=1, stage="train", steps=10**6, checkpoint_every=100, seed=7))
        script = render_agent(bucket=BUCKET, run_key=RUN_KEY)
        started = time.perf_counter()
        os.environ.pop(SHARED_ENV, None)  # its own zygote, whose start it measures (not a test run's shared one)
        zygote = ForkServer.wait_shared()
        if zygote is None:
            raise SystemExit("the fork server did not start")
        assert zygote.proc is not None
        zygote_s, zygote_cpu = time.perf_counter() - started, process_cpu(zygote.proc.pid)
        boot_once(script, work, 0, forked=False)  # the first checkpoint and compilation-cache entries
        for n in range(args.boots):
            for way in results:
                results[way].append(boot_once(script, work, len(results) * n + (way == "forked") + 1, way == "forked"))
    server.shutdown()
    summary = {
        way: {
            "boots": len(runs),
            "to_training_s_median": round(statistics.median(t for t, _ in runs), 3),
            "cpu_s_median": round(statistics.median(c for _, c in runs), 3),
            "cpu_s_max": round(max(c for _, c in runs), 3),
        }
        for way, runs in results.items()
    }
    summary["zygote"] = {"start_s": round(zygote_s, 2), "cpu_s": round(zygote_cpu, 3)}
    summary["load_before"] = " ".join(load)
    summary["load_after"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    saved = summary["cold"]["cpu_s_median"] - summary["forked"]["cpu_s_median"]  # type: ignore[operator]
    summary["cpu_s_saved_per_boot"] = round(saved, 3)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for way in results:
            print(f"{way:7s} {summary[way]}")
        print(
            f"zygote once: {summary['zygote']}; saved per boot {saved:.2f} CPU-s; "
            f"load {load} -> {summary['load_after']}"
        )
    forked_cpu = summary["forked"]["cpu_s_median"]  # type: ignore[index]
    verdict = "met" if forked_cpu <= GOAL_CPU_S else f"NOT met ({forked_cpu:.2f} CPU-s)"
    print(f"goal: a forked boot's machine CPU to the training line <= {GOAL_CPU_S} CPU-s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
