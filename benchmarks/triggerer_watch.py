"""What does watching N training machines cost one real Airflow triggerer? (issue 6)

    .venv/bin/python benchmarks/triggerer_watch.py --machines 1000 --seconds 60
    .venv/bin/python benchmarks/triggerer_watch.py --machines 50 --seconds 20     # quick

Starts the local cloud (scenario ``benchmark``), creates N TPU nodes without a startup script (no guest
processes: we measure the watcher, not the watched), seeds each stage's GCS facts (progress + one
committed checkpoint, as for a stage that is training), starts a real ``airflow triggerer`` on a
SQLite AIRFLOW_HOME in a temp dir, measures it idle, then hands it N StageTriggers (one DAG run, N
deferred mapped task instances, see ``deferred_seed.py``) and measures a fixed window: CPU of the
triggerer's process tree (user+sys deltas), its memory above the idle figure, and the calls it makes
to the TPU API and to GCS (counted by a proxy in front of each, see ``counting_proxy.py``). The CPU of
the trigger-runner process is split between its event-loop thread (TPU list, state machine, logging)
and its other threads (``asyncio.to_thread``: the GCS reads), so the cost of the GCS side shows alone.

Prints a table and one ``RESULT {json}`` line. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from counting_proxy import CountingProxy, classify_api, classify_gcs  # noqa: E402
from deferred_seed import write_dag  # noqa: E402

from interlude.dev import LocalCloud, airflow_env, ensure_bucket, start_localcloud  # noqa: E402

DAG_ID = "interlude_bench_watch"
RUN_ID = "bench"
BUCKET = "interlude-bench"
ACCELERATOR = "v5litepod-8"
RUNTIME = "v2-alpha-tpuv5-lite"
ZONES = ("us-central1-a", "us-central2-b")
NOFILE = 8192


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- machines
def create_nodes(cloud: LocalCloud, n: int, zones: int) -> list[dict[str, str]]:
    """N READY nodes (no startup-script metadata, so no guest process), spread over the first zones."""
    placements = [
        {"kind": "tpu_node", "zone": ZONES[i % zones], "name": f"bench-{i:05d}", "run_key": f"bench-{i:05d}"}
        for i in range(n)
    ]
    session = requests.Session()
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=16)
    session.mount("http://", adapter)

    def create(p: dict[str, str]) -> None:
        url = f"{cloud.api_endpoint}/v2/projects/{cloud.project}/locations/{p['zone']}/nodes"
        resp = session.post(
            url,
            params={"nodeId": p["name"]},
            json={"acceleratorType": ACCELERATOR, "runtimeVersion": RUNTIME},
            timeout=60,
        )
        resp.raise_for_status()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, placements))
    deadline = time.monotonic() + 120
    while True:
        ready = 0
        for zone in ZONES[:zones]:
            url = f"{cloud.api_endpoint}/v2/projects/{cloud.project}/locations/{zone}/nodes"
            nodes = session.get(url, timeout=60).json().get("nodes", [])
            ready += sum(1 for node in nodes if node.get("state") == "READY")
        if ready >= n:
            return placements
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {ready}/{n} nodes READY after 120 s")
        time.sleep(0.5)


def seed_gcs(cloud: LocalCloud, placements: list[dict[str, str]], state: str) -> None:
    """Each stage's GCS facts as a training stage has them: progress.json and one committed checkpoint."""
    if state == "none":
        return
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from interlude_workload.checkpoints import CheckpointStore

    local = threading.local()

    def client() -> storage.Client:
        if not hasattr(local, "client"):
            local.client = storage.Client(
                project=cloud.project,
                credentials=AnonymousCredentials(),
                client_options={"api_endpoint": cloud.gcs_endpoint},
            )
        return local.client

    def seed_one(p: dict[str, str]) -> None:
        store = CheckpointStore(BUCKET, p["run_key"], "train", client=client())
        store.write_progress(
            {"step": 100, "total_steps": 1_000_000, "loss": 0.5, "state": "running", "boot_id": "bench-boot"}
        )
        if state == "checkpoint":
            store.write(100, {"model.bin": b"\0" * 256}, metrics={"loss": 0.5})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(seed_one, placements))


# --------------------------------------------------------------------------------------------- airflow
def airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


def prepare_airflow(env: dict[str, str], n: int) -> None:
    """Fresh SQLite metadata DB and the benchmark DAG serialized into it (what a dag-processor does)."""
    write_dag(Path(env["AIRFLOW__CORE__DAGS_FOLDER"]), DAG_ID, n)
    home = Path(env["AIRFLOW_HOME"])
    for cmd in (["db", "migrate"], ["dags", "reserialize"]):
        with open(home / "setup.log", "a") as out:
            subprocess.run(
                [airflow_bin(), *cmd], env=env, check=True, stdout=out, stderr=subprocess.STDOUT, timeout=300
            )


def _raise_nofile() -> None:
    """In the triggerer's child: own session, and room for one open log file per running trigger."""
    os.setsid()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE if hard == resource.RLIM_INFINITY else min(max(NOFILE, hard), hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def start_triggerer(env: dict[str, str]) -> subprocess.Popen[bytes]:
    home = Path(env["AIRFLOW_HOME"])
    out = open(home / "triggerer.log", "wb")
    return subprocess.Popen(
        [airflow_bin(), "triggerer", "--skip-serve-logs"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        preexec_fn=_raise_nofile,
    )


def stop_process_group(proc: subprocess.Popen[Any], grace: float = 30) -> None:
    """SIGTERM the group we created (setsid in the child), SIGKILL it after the grace."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers (the trigger runner) of our own group
    except ProcessLookupError:
        pass
    proc.wait()


def db_query(home: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(home / "airflow.db", timeout=30) as db:
        return list(db.execute(sql))


def wait_for_triggerer_job(home: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"triggerer exited with {proc.returncode}; see {home / 'triggerer.log'}")
        try:
            sql = "select count(*) from job where job_type='TriggererJob' and state='running'"
            if db_query(home, sql)[0][0] and len(tree(proc.pid)) >= 2:  # the trigger runner is up too
                return
        except sqlite3.OperationalError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the triggerer did not start within the timeout")


def polled_triggers(home: Path) -> int:
    """Triggers whose log has a poll line ("... (RUNNING, machine READY)"): logged after the first poll."""
    return sum(
        1
        for p in (home / "logs").glob(f"dag_id={DAG_ID}/**/*.trigger.*.log")
        if ", machine " in p.read_text(errors="replace")
    )


# --------------------------------------------------------------------------------------------- measuring
def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@dataclass
class Sample:
    t: float
    cpu: dict[int, float]  # pid -> user+sys seconds
    threads: dict[int, tuple[float, float]]  # pid -> (main-thread seconds, other-threads seconds)
    rss: int
    pss: int
    calls: Counter[str] = field(default_factory=Counter)


def sample(pid: int, proxies: list[CountingProxy], memory: bool = True) -> Sample:
    cpu: dict[int, float] = {}
    threads: dict[int, tuple[float, float]] = {}
    rss = pss = 0
    for p in tree(pid):
        try:
            with p.oneshot():
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
                main = other = 0.0
                for th in p.threads():
                    if th.id == p.pid:
                        main += th.user_time + th.system_time
                    else:
                        other += th.user_time + th.system_time
                threads[p.pid] = (main, other)
                if memory:
                    m = p.memory_full_info()
                    rss += m.rss
                    pss += m.pss
        except psutil.NoSuchProcess:
            continue
    calls: Counter[str] = Counter()
    for proxy in proxies:
        calls.update(proxy.snapshot())
    return Sample(time.monotonic(), cpu, threads, rss, pss, calls)


def cpu_delta(a: Sample, b: Sample) -> float:
    return sum(b.cpu[pid] - a.cpu.get(pid, 0.0) for pid in b.cpu)


# --------------------------------------------------------------------------------------------- main
def run(args: argparse.Namespace) -> dict[str, Any]:  # noqa: C901 - TODO(issue 16): split with the triggerer-cost rework
    work = Path(tempfile.mkdtemp(prefix="interlude-bench-"))
    log(f"work dir {work}")
    cloud: LocalCloud | None = None
    proxies: list[CountingProxy] = []
    triggerer: subprocess.Popen[bytes] | None = None
    setup: threading.Thread | None = None
    try:
        t0 = time.monotonic()
        cloud = start_localcloud(ROOT / "include" / "localcloud" / "scenarios" / "benchmark.yaml", work / "localcloud")
        ensure_bucket(cloud, BUCKET)
        api = CountingProxy(cloud.api_endpoint, classify_api).start()
        gcs = CountingProxy(cloud.gcs_endpoint, classify_gcs).start()
        proxies = [api, gcs]
        home = work / "airflow"
        home.mkdir()
        env = airflow_env(home, replace(cloud, api_endpoint=api.endpoint, gcs_endpoint=gcs.endpoint))
        env.update(
            {
                "AIRFLOW__CORE__DAGS_FOLDER": str(work / "dags"),
                "AIRFLOW__TRIGGERER__CAPACITY": str(max(1000, args.machines)),
                # Default 50 per loop: N triggers would trickle in for N/50 loops; the steady state is the same.
                "AIRFLOW__TRIGGERER__MAX_TRIGGER_TO_SELECT_PER_LOOP": str(max(50, args.machines)),
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            }
        )
        setup_error: list[BaseException] = []

        def prepare() -> None:
            try:
                prepare_airflow(env, args.machines)
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                setup_error.append(e)

        setup = threading.Thread(target=prepare, name="airflow-setup")
        setup.start()
        log(f"creating {args.machines} TPU nodes in {args.zones} zone(s)")
        placements = create_nodes(cloud, args.machines, args.zones)
        log(f"seeding GCS ({args.gcs_state}) for {args.machines} stages")
        seed_gcs(cloud, placements, args.gcs_state)
        setup.join()
        if setup_error:
            raise RuntimeError(f"airflow setup failed; see {home / 'setup.log'}") from setup_error[0]
        log(f"setup took {time.monotonic() - t0:.0f} s; starting the triggerer")

        triggerer = start_triggerer(env)
        wait_for_triggerer_job(home, triggerer)
        time.sleep(args.settle)
        idle_a = sample(triggerer.pid, proxies)
        time.sleep(args.idle_seconds)
        idle_b = sample(triggerer.pid, proxies)
        idle_cpu = cpu_delta(idle_a, idle_b) / (idle_b.t - idle_a.t)
        log(
            f"idle triggerer: RSS {idle_b.rss / 2**20:.0f} MB, PSS {idle_b.pss / 2**20:.0f} MB, "
            f"CPU {idle_cpu * 100:.1f}%"
        )

        spec = {
            "dag_id": DAG_ID,
            "run_id": RUN_ID,
            "bucket": BUCKET,
            "poll_interval": args.poll_interval,
            "restart_timeout": 3600.0,
            "placements": placements,
        }
        (work / "spec.json").write_text(json.dumps(spec))
        subprocess.run(
            [sys.executable, str(HERE / "deferred_seed.py"), str(work / "spec.json")],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=open(home / "seed.log", "wb"),
        )
        log(f"{args.machines} deferred task instances + trigger rows written; waiting for the first polls")
        t_seeded = time.monotonic()
        deadline = t_seeded + args.startup_timeout
        polled = 0
        while (polled := polled_triggers(home)) < args.machines:
            if triggerer.poll() is not None:
                raise RuntimeError(f"triggerer exited ({triggerer.returncode}); see {home / 'triggerer.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{polled}/{args.machines} triggers polled in {args.startup_timeout} s")
            time.sleep(1)
        ramp = time.monotonic() - t_seeded
        log(f"all {polled} triggers polled once after {ramp:.1f} s; warming up {args.poll_interval:.0f} s")
        time.sleep(args.poll_interval)

        log(f"measuring for {args.seconds:.0f} s")
        a = sample(triggerer.pid, proxies)
        peak_rss, rss_sum, pss_sum, k = a.rss, 0, 0, 0
        end = a.t + args.seconds
        while (now := time.monotonic()) < end:
            time.sleep(min(args.seconds / 10, end - now))
            s = sample(triggerer.pid, proxies)
            peak_rss = max(peak_rss, s.rss)
            rss_sum, pss_sum, k = rss_sum + s.rss, pss_sum + s.pss, k + 1
        b = sample(triggerer.pid, proxies)
        wall = b.t - a.t
        if triggerer.poll() is not None:
            raise RuntimeError(f"triggerer exited during the window; see {home / 'triggerer.log'}")

        states = dict(
            db_query(
                home,
                f"select coalesce(state, 'none'), count(*) from task_instance where dag_id='{DAG_ID}' group by state",
            )
        )
        assigned = db_query(home, "select count(*) from trigger where triggerer_id is not null")[0][0]
        calls = b.calls - a.calls
        per_min = {k2: v * 60 / wall for k2, v in sorted(calls.items())}
        tpu_per_min = sum(v for k2, v in per_min.items() if not k2.startswith("gcs.") and "!" not in k2)
        gcs_per_min = sum(v for k2, v in per_min.items() if k2.startswith("gcs.") and "!" not in k2)
        polls_per_min = per_min.get("gcs.list_objects", 0.0)  # read_stage_facts lists step dirs once a poll
        root_pid = triggerer.pid
        # Runner CPU not on its main (event-loop) thread: worker threads, including short-lived ones that
        # exited within the window (google-cloud-storage starts a bucket-metadata thread per Client).
        runner_loop = sum(
            main - a.threads.get(pid, (0.0, 0.0))[0] for pid, (main, _other) in b.threads.items() if pid != root_pid
        )
        runner_all = sum(b.cpu[pid] - a.cpu.get(pid, 0.0) for pid in b.cpu if pid != root_pid)
        runner_threads = runner_all - runner_loop
        supervisor = b.cpu.get(root_pid, 0.0) - a.cpu.get(root_pid, 0.0)
        cpu = cpu_delta(a, b)
        mean_rss = rss_sum / k if k else b.rss
        mean_pss = pss_sum / k if k else b.pss
        result = {
            "machines": args.machines,
            "zones": args.zones,
            "poll_interval_s": args.poll_interval,
            "window_s": round(wall, 1),
            "gcs_state": args.gcs_state,
            "cores": psutil.cpu_count(),
            "triggers_polled": polled,
            "triggers_assigned": assigned,
            "ramp_up_s": round(ramp, 1),
            "task_instance_states": states,
            "idle": {
                "cpu_pct": round(idle_cpu * 100, 2),
                "rss_mb": round(idle_b.rss / 2**20, 1),
                "pss_mb": round(idle_b.pss / 2**20, 1),
            },
            "cpu_pct": round(cpu / wall * 100, 2),
            "cpu_pct_above_idle": round((cpu / wall - idle_cpu) * 100, 2),
            "cpu_split_pct": {
                "supervisor_process": round(supervisor / wall * 100, 2),
                "runner_event_loop_thread": round(runner_loop / wall * 100, 2),
                "runner_other_threads_gcs_reads": round(runner_threads / wall * 100, 2),
            },
            "rss_mb": round(mean_rss / 2**20, 1),
            "rss_peak_mb": round(peak_rss / 2**20, 1),
            "rss_above_idle_mb": round((mean_rss - idle_b.rss) / 2**20, 1),
            "pss_mb": round(mean_pss / 2**20, 1),
            "pss_above_idle_mb": round((mean_pss - idle_b.pss) / 2**20, 1),
            "kb_per_trigger_rss": round((mean_rss - idle_b.rss) / 1024 / args.machines, 1),
            "calls_per_min": {k2: round(v, 1) for k2, v in per_min.items()},
            "tpu_api_calls_per_min": round(tpu_per_min, 1),
            "gcs_calls_per_min": round(gcs_per_min, 1),
            "polls_per_trigger_per_min": round(polls_per_min / args.machines, 2),
            "expected_polls_per_trigger_per_min": round(60 / args.poll_interval, 2),
            "gcs_calls_per_poll": round(gcs_per_min / polls_per_min, 2) if polls_per_min else None,
        }
        return result
    finally:
        if setup is not None and setup.is_alive():
            setup.join()
        if triggerer is not None:
            stop_process_group(triggerer)
        for proxy in proxies:
            proxy.stop()
        if cloud is not None:
            cloud.stop()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def report(r: dict[str, Any]) -> str:
    lines = [
        f"StageTrigger watch benchmark: {r['machines']} machines, {r['zones']} zone(s), poll every "
        f"{r['poll_interval_s']:g} s, window {r['window_s']:g} s, {r['cores']} cores, "
        f"GCS facts: {r['gcs_state']}",
        f"  triggers polled / assigned      {r['triggers_polled']} / {r['triggers_assigned']}  "
        f"(all polled {r['ramp_up_s']:g} s after the rows were written); "
        f"TI states {r['task_instance_states']}",
        f"  idle triggerer                  CPU {r['idle']['cpu_pct']:.2f}%  "
        f"RSS {r['idle']['rss_mb']:.0f} MB  PSS {r['idle']['pss_mb']:.0f} MB",
        f"  triggerer CPU (tree)            {r['cpu_pct']:.1f}% of one core "
        f"({r['cpu_pct_above_idle']:.1f}% above idle)",
        f"    supervisor process            {r['cpu_split_pct']['supervisor_process']:.1f}%",
        f"    runner event-loop thread      {r['cpu_split_pct']['runner_event_loop_thread']:.1f}%",
        f"    runner worker threads (GCS)   {r['cpu_split_pct']['runner_other_threads_gcs_reads']:.1f}%",
        f"  memory                          RSS {r['rss_mb']:.0f} MB (peak {r['rss_peak_mb']:.0f}), "
        f"{r['rss_above_idle_mb']:.0f} MB above idle RSS ({r['kb_per_trigger_rss']:.0f} KB/trigger), "
        f"PSS {r['pss_mb']:.0f} MB (+{r['pss_above_idle_mb']:.0f} MB)",
        f"  TPU API calls/min               {r['tpu_api_calls_per_min']:.1f}",
        f"  GCS calls/min                   {r['gcs_calls_per_min']:.1f}  ({r['gcs_calls_per_poll']} per poll)",
        f"  polls per trigger per minute    {r['polls_per_trigger_per_min']:.2f} "
        f"(expected {r['expected_polls_per_trigger_per_min']:.2f})",
        "  calls/min by kind: " + ", ".join(f"{k} {v:g}" for k, v in r["calls_per_min"].items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--machines", type=int, default=1000, help="TPU nodes, one StageTrigger each")
    p.add_argument("--seconds", type=float, default=60.0, help="measurement window")
    p.add_argument("--poll-interval", type=float, default=10.0, help="StageTrigger poll_interval")
    p.add_argument(
        "--zones",
        type=int,
        default=1,
        choices=range(1, len(ZONES) + 1),
        help="spread the machines over this many zones (one list call per zone and interval)",
    )
    p.add_argument(
        "--gcs-state",
        choices=("none", "progress", "checkpoint"),
        default="checkpoint",
        help="what each stage has in GCS: nothing, progress.json, or progress + a checkpoint",
    )
    p.add_argument("--idle-seconds", type=float, default=10.0, help="window for the idle triggerer's CPU")
    p.add_argument(
        "--settle", type=float, default=5.0, help="seconds after the triggerer is up before the idle sampling"
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        help="seconds for every trigger to poll once after the rows are written",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, airflow.db)")
    args = p.parse_args(argv)
    result = run(args)
    print(report(result))
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
