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
from progress_writer import ProgressWriter  # noqa: E402

from interlude_dev import warm_cli  # noqa: E402
from interlude_dev.wiring import (  # noqa: E402
    TRIGGERER_ENV,
    LocalCloud,
    airflow_env,
    ensure_airflow_db,
    ensure_bucket,
    start_localcloud,
)

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
    state = "checkpoint" if state == "training" else state
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

    # One real Orbax save, copied to every stage (interlude_workload.testing.clone_step: a save per stage is slow
    # and Orbax's endpoint is per process, not per thread).
    template = CheckpointStore(BUCKET, "bench-template", "train", client=client())
    if state == "checkpoint":
        import numpy as np

        template.write(100, {"w": np.zeros(64)}, metrics={"loss": 0.5})

    def seed_one(p: dict[str, str]) -> None:
        from interlude_workload.testing import clone_step

        store = CheckpointStore(BUCKET, p["run_key"], "train", client=client())
        store.write_progress(
            {"step": 100, "total_steps": 1_000_000, "loss": 0.5, "state": "running", "boot_id": "bench-boot"}
        )
        if state == "checkpoint":
            clone_step(template, 100, store)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(seed_one, placements))


# --------------------------------------------------------------------------------------------- airflow
def airflow_bin() -> str:
    return str(Path(sys.executable).parent / "airflow")


def prepare_airflow(env: dict[str, str], n: int) -> None:
    """Fresh SQLite metadata DB and the benchmark DAG serialized into it (what a dag-processor does)."""
    write_dag(Path(env["AIRFLOW__CORE__DAGS_FOLDER"]), DAG_ID, n)
    home = Path(env["AIRFLOW_HOME"])
    ensure_airflow_db(env, home / "setup.log")  # `db migrate`, or a copy of the test suite's migrated DB
    # A new `airflow` process, or a child of the test suite's warm server when run by a test (warm_cli): setup,
    # not measured.
    warm_cli.check_airflow(["dags", "reserialize"], env, home / "setup.log", timeout=300)


def _raise_nofile() -> None:
    """In the triggerer's child: own session, and room for one open log file per running trigger."""
    os.setsid()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE if hard == resource.RLIM_INFINITY else min(max(NOFILE, hard), hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def start_triggerer(env: dict[str, str]) -> subprocess.Popen[bytes]:
    home = Path(env["AIRFLOW_HOME"])
    out = open(home / "triggerer.log", "ab")
    return subprocess.Popen(
        [airflow_bin(), "triggerer", "--skip-serve-logs"],
        env={**env, **TRIGGERER_ENV},  # as the product runs it (docker-compose.yaml, the local stack)
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


def polled_triggers(home: Path, run_id: str, marker: str = ", machine ") -> int:
    """Triggers whose log has a poll line ("... (RUNNING, machine READY)"): logged after the first poll."""
    return sum(
        1
        for p in (home / "logs").glob(f"dag_id={DAG_ID}/run_id={run_id}/**/*.trigger.*.log")
        if marker in p.read_text(errors="replace")
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
    rss_by_pid: dict[int, int] = field(default_factory=dict)
    calls: Counter[str] = field(default_factory=Counter)
    load: float = 0.0  # the machine's 1-minute load average


def sample(pid: int, proxies: list[CountingProxy], memory: bool = True) -> Sample:
    cpu: dict[int, float] = {}
    threads: dict[int, tuple[float, float]] = {}
    rss = pss = 0
    rss_by_pid: dict[int, int] = {}
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
                    rss_by_pid[p.pid] = m.rss
        except psutil.NoSuchProcess:
            continue
    calls: Counter[str] = Counter()
    for proxy in proxies:
        calls.update(proxy.snapshot())
    return Sample(time.monotonic(), cpu, threads, rss, pss, rss_by_pid, calls, os.getloadavg()[0])


def cpu_delta(a: Sample, b: Sample) -> float:
    return sum(b.cpu[pid] - a.cpu.get(pid, 0.0) for pid in b.cpu)


# --------------------------------------------------------------------------------------------- designs
DESIGNS: dict[str, dict[str, Any]] = {
    # Airflow's own floor: the same N deferred task instances, each with Airflow's DateTimeTrigger a day ahead
    # (it logs twice and sleeps): what any N triggers cost this triggerer, whatever they watch.
    "floor": {},
    # Each trigger reads its own stage's GCS facts every poll and logs a line every 30 s (the first design;
    # triggerer_watch_modes.PerStageReadsTrigger, as "before").
    "naive": {"gcs_every": 1, "log_every": 30.0},
    # Before issue 16: its own reads every third poll while calm, a log line every 30 s.
    "before": {"gcs_every": 3, "log_every": 30.0},
    # After: one shared listing per bucket and interval, downloads only on change, log on change or 300 s.
    "after": {},
    # The after design as another git ref has it (--main-ref, default the main branch): its `interlude` package
    # exported from git into the work dir and put first on the triggerer's PYTHONPATH, for before/after in one run.
    "main": {},
}
FLOOR = "floor"
MAIN = "main"
TRIGGERS = {FLOOR: "datetime", "naive": "per_stage", "before": "per_stage"}
"""deferred_seed.py's trigger per design (else "stage", the shipped StageTrigger): Airflow's DateTimeTrigger, or the
benchmark's own per-stage reads (triggerer_watch_modes.py, kept out of the shipped package)."""
POLL_MARKERS = {FLOOR: "seconds remaining"}  # a trigger's first log line after its first poll, per design


@dataclass
class Bench:
    """What every design shares: the local cloud, its proxies, the nodes, the seeded GCS, the Airflow home."""

    work: Path
    env: dict[str, str]
    home: Path
    proxies: list[CountingProxy]
    placements: list[dict[str, str]]
    main_plugins: Path | None = None  # the exported plugins/ of --main-ref, for the "main" design
    writer: ProgressWriter | None = None  # --gcs-state training: every stage's progress rewritten each poll


def setup(args: argparse.Namespace, work: Path, cloud: LocalCloud) -> Bench:
    t0 = time.monotonic()
    ensure_bucket(cloud, BUCKET)
    api = CountingProxy(cloud.api_endpoint, classify_api).start()
    gcs = CountingProxy(cloud.gcs_endpoint, classify_gcs).start()
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
            # The triggerer imports each trigger by its serialized dotted path: this folder's modules
            # (triggerer_watch_modes.PerStageReadsTrigger) must be importable there.
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH", "")])),
        }
    )
    setup_error: list[BaseException] = []

    def prepare() -> None:
        try:
            prepare_airflow(env, args.machines)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            setup_error.append(e)

    thread = threading.Thread(target=prepare, name="airflow-setup")
    thread.start()
    try:
        log(f"creating {args.machines} TPU nodes in {args.zones} zone(s)")
        placements = create_nodes(cloud, args.machines, args.zones)
        log(f"seeding GCS ({args.gcs_state}) for {args.machines} stages")
        seed_gcs(cloud, placements, args.gcs_state)
    except BaseException:
        api.stop()
        gcs.stop()
        raise
    finally:
        thread.join()
    if setup_error:
        raise RuntimeError(f"airflow setup failed; see {home / 'setup.log'}") from setup_error[0]
    log(f"setup took {time.monotonic() - t0:.0f} s")
    return Bench(work, env, home, [api, gcs], placements)


def export_tree(ref: str, dest: Path) -> Path:
    """The ``plugins/`` of a git ref, exported (not checked out: the repository is left alone) into ``dest``."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "plugins"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "plugins"


def design_env(bench: Bench, design: str) -> dict[str, str]:
    """The design's triggerer environment: for ``main``, its exported ``interlude`` first on the path, checked."""
    if design != MAIN:
        return bench.env
    assert bench.main_plugins is not None
    plugins = str(bench.main_plugins)
    env = {
        **bench.env,
        "PYTHONPATH": os.pathsep.join(filter(None, [plugins, bench.env.get("PYTHONPATH", "")])),
        "AIRFLOW__CORE__PLUGINS_FOLDER": plugins,
    }
    where = subprocess.run(
        [sys.executable, "-c", "import interlude.triggers.stage as m; print(m.__file__)"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not where.startswith(plugins):
        raise RuntimeError(f"design {MAIN!r} would import interlude from {where}, not from {plugins}")
    return env


def retire_run(home: Path, run_id: str) -> None:
    """After a design: its instances leave DEFERRED and its trigger rows go, so the next triggerer starts empty."""
    with sqlite3.connect(home / "airflow.db", timeout=30) as db:
        db.execute(
            "update task_instance set state='removed', trigger_id=null where dag_id=? and run_id=?", (DAG_ID, run_id)
        )
        db.execute("update dag_run set state='success' where dag_id=? and run_id=?", (DAG_ID, run_id))
        db.execute("delete from trigger")


def measure_idle(bench: Bench, triggerer: subprocess.Popen[bytes], args: argparse.Namespace) -> tuple[Sample, float]:
    wait_for_triggerer_job(bench.home, triggerer)
    time.sleep(args.settle)
    idle_a = sample(triggerer.pid, bench.proxies)
    time.sleep(args.idle_seconds)
    idle_b = sample(triggerer.pid, bench.proxies)
    idle_cpu = cpu_delta(idle_a, idle_b) / (idle_b.t - idle_a.t)
    log(f"idle triggerer: RSS {idle_b.rss / 2**20:.0f} MB, PSS {idle_b.pss / 2**20:.0f} MB, CPU {idle_cpu * 100:.1f}%")
    return idle_b, idle_cpu


def defer_all(bench: Bench, args: argparse.Namespace, design: str, run_id: str) -> None:
    spec = {
        "dag_id": DAG_ID,
        "run_id": run_id,
        "bucket": BUCKET,
        "poll_interval": args.poll_interval,
        "restart_timeout": 3600.0,
        "trigger_kwargs": DESIGNS[design],
        "trigger": TRIGGERS.get(design, "stage"),
        "placements": bench.placements,
    }
    (bench.work / "spec.json").write_text(json.dumps(spec))
    with open(bench.home / "seed.log", "ab") as err:
        subprocess.run(
            [sys.executable, str(HERE / "deferred_seed.py"), str(bench.work / "spec.json")],
            env=bench.env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def wait_first_polls(
    bench: Bench, triggerer: subprocess.Popen[bytes], args: argparse.Namespace, run_id: str, design: str
) -> int:
    deadline = time.monotonic() + args.startup_timeout
    marker = POLL_MARKERS.get(design, ", machine ")
    while (polled := polled_triggers(bench.home, run_id, marker)) < args.machines:
        if triggerer.poll() is not None:
            raise RuntimeError(f"triggerer exited ({triggerer.returncode}); see {bench.home / 'triggerer.log'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{polled}/{args.machines} triggers polled in {args.startup_timeout} s")
        time.sleep(1)
    return polled


def window(bench: Bench, triggerer: subprocess.Popen[bytes], seconds: float) -> tuple[Sample, Sample, dict[str, float]]:
    """Sample over the window: start and end samples, plus the mean and peak memory in between."""
    a = sample(triggerer.pid, bench.proxies)
    peak_rss, rss_sum, pss_sum, k = a.rss, 0, 0, 0
    end = a.t + seconds
    while (now := time.monotonic()) < end:
        time.sleep(min(seconds / 10, end - now))
        s = sample(triggerer.pid, bench.proxies)
        peak_rss = max(peak_rss, s.rss)
        rss_sum, pss_sum, k = rss_sum + s.rss, pss_sum + s.pss, k + 1
    b = sample(triggerer.pid, bench.proxies)
    if triggerer.poll() is not None:
        raise RuntimeError(f"triggerer exited during the window; see {bench.home / 'triggerer.log'}")
    memory = {"peak_rss": peak_rss, "rss": rss_sum / k if k else b.rss, "pss": pss_sum / k if k else b.pss}
    return a, b, memory


def measure(bench: Bench, args: argparse.Namespace, design: str, index: int) -> dict[str, Any]:
    """One design in a fresh triggerer: idle figure, N deferred triggers, first polls, warm-up, the window."""
    run_id = f"{RUN_ID}-{index}-{design}"
    log(f"design {design!r}: starting a triggerer")
    triggerer = start_triggerer(design_env(bench, design))
    try:
        idle, idle_cpu = measure_idle(bench, triggerer, args)
        defer_all(bench, args, design, run_id)
        log(f"{args.machines} deferred task instances + trigger rows written; waiting for the first polls")
        t_seeded = time.monotonic()
        polled = wait_first_polls(bench, triggerer, args, run_id, design)
        ramp = time.monotonic() - t_seeded
        warm_up = args.poll_interval + args.warm_up
        t_polled = time.monotonic()
        log(f"all {polled} triggers polled once after {ramp:.1f} s; warming up {warm_up:.0f} s")
        time.sleep(warm_up)
        log(f"measuring for {args.seconds:.0f} s")
        written = writes(bench)
        a, b, memory = window(bench, triggerer, args.seconds)
        written = writes(bench) - written
        steady = None
        if args.steady_at:
            time.sleep(max(0.0, t_polled + args.steady_at - time.monotonic()))
            log(
                f"steady state: measuring for {args.steady_seconds:.0f} s, {args.steady_at:.0f} s after the first polls"
            )
            swritten = writes(bench)
            sa, sb, smemory = window(bench, triggerer, args.steady_seconds)
            steady = figures(args, sa, sb, smemory, idle, idle_cpu, triggerer.pid)
            steady["progress_writes_per_min"] = round((writes(bench) - swritten) * 60 / (sb.t - sa.t), 1)
            steady["window_start_s"] = round(sa.t - t_polled, 1)
        states = dict(
            db_query(
                bench.home,
                "select coalesce(state, 'none'), count(*) from task_instance "
                f"where dag_id='{DAG_ID}' and run_id='{run_id}' group by state",
            )
        )
        assigned = db_query(bench.home, "select count(*) from trigger where triggerer_id is not null")[0][0]
        result = figures(args, a, b, memory, idle, idle_cpu, triggerer.pid)
        result.update(
            {"design": design, "triggers_polled": polled, "triggers_assigned": assigned, "ramp_up_s": round(ramp, 1)}
        )
        result["task_instance_states"] = states
        result["window_start_s"] = round(a.t - t_polled, 1)
        result["progress_writes_per_min"] = round(written * 60 / (b.t - a.t), 1)
        if steady is not None:
            steady.update({k: result[k] for k in ("design", "triggers_polled", "triggers_assigned", "ramp_up_s")})
            steady["task_instance_states"] = states
            result["steady"] = steady
        return result
    finally:
        stop_process_group(triggerer)
        retire_run(bench.home, run_id)


def writes(bench: Bench) -> int:
    """Progress rewrites so far (0 without a writer)."""
    return bench.writer.writes if bench.writer is not None else 0


def figures(
    args: argparse.Namespace,
    a: Sample,
    b: Sample,
    memory: dict[str, float],
    idle: Sample,
    idle_cpu: float,
    root_pid: int,
) -> dict[str, Any]:
    wall = b.t - a.t
    calls = b.calls - a.calls
    per_min = {k2: v * 60 / wall for k2, v in sorted(calls.items())}
    tpu_per_min = sum(v for k2, v in per_min.items() if not k2.startswith("gcs.") and "!" not in k2)
    gcs_per_min = sum(v for k2, v in per_min.items() if k2.startswith("gcs.") and "!" not in k2)
    lists_per_min = per_min.get("gcs.list_objects", 0.0)
    # Runner CPU not on its main (event-loop) thread: worker threads, including short-lived ones that
    # exited within the window (google-cloud-storage starts a bucket-metadata thread per Client).
    runner_loop = sum(
        main - a.threads.get(pid, (0.0, 0.0))[0] for pid, (main, _other) in b.threads.items() if pid != root_pid
    )
    runner_all = sum(b.cpu[pid] - a.cpu.get(pid, 0.0) for pid in b.cpu if pid != root_pid)
    supervisor = b.cpu.get(root_pid, 0.0) - a.cpu.get(root_pid, 0.0)
    cpu = cpu_delta(a, b)
    return {
        "machines": args.machines,
        "zones": args.zones,
        "poll_interval_s": args.poll_interval,
        "window_s": round(wall, 1),
        "warm_up_s": args.poll_interval + args.warm_up,
        "gcs_state": args.gcs_state,
        "cores": psutil.cpu_count(),
        "load_1m": [round(a.load, 2), round(b.load, 2)],  # at the window's start and end
        "idle": {
            "cpu_pct": round(idle_cpu * 100, 2),
            "rss_mb": round(idle.rss / 2**20, 1),
            "pss_mb": round(idle.pss / 2**20, 1),
        },
        "cpu_pct": round(cpu / wall * 100, 2),
        "cpu_pct_above_idle": round((cpu / wall - idle_cpu) * 100, 2),
        "cpu_split_pct": {
            "supervisor_process": round(supervisor / wall * 100, 2),
            "runner_event_loop_thread": round(runner_loop / wall * 100, 2),
            "runner_other_threads_gcs_reads": round((runner_all - runner_loop) / wall * 100, 2),
        },
        "rss_above_idle_split_mb": {
            "supervisor_process": round((b.rss_by_pid.get(root_pid, 0) - idle.rss_by_pid.get(root_pid, 0)) / 2**20, 1),
            "trigger_runner": round(
                sum(v for k, v in b.rss_by_pid.items() if k != root_pid) / 2**20
                - sum(v for k, v in idle.rss_by_pid.items() if k != root_pid) / 2**20,
                1,
            ),
        },
        "rss_mb": round(memory["rss"] / 2**20, 1),
        "rss_peak_mb": round(memory["peak_rss"] / 2**20, 1),
        "rss_above_idle_mb": round((memory["rss"] - idle.rss) / 2**20, 1),
        "pss_mb": round(memory["pss"] / 2**20, 1),
        "pss_above_idle_mb": round((memory["pss"] - idle.pss) / 2**20, 1),
        "kb_per_trigger_rss": round((memory["rss"] - idle.rss) / 1024 / args.machines, 1),
        "calls_per_min": {k2: round(v, 1) for k2, v in per_min.items()},
        "tpu_api_calls_per_min": round(tpu_per_min, 1),
        "gcs_calls_per_min": round(gcs_per_min, 1),
        "gcs_lists_per_min": round(lists_per_min, 1),
        "gcs_calls_per_trigger_per_min": round(gcs_per_min / args.machines, 3),
        "expected_polls_per_trigger_per_min": round(60 / args.poll_interval, 2),
    }


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Shared setup once, then each design in sequence in its own fresh triggerer; everything stopped at the end."""
    work = Path(tempfile.mkdtemp(prefix="interlude-bench-"))
    log(f"work dir {work}")
    cloud: LocalCloud | None = None
    bench: Bench | None = None
    try:
        cloud = start_localcloud(
            ROOT / "include" / "interlude_localcloud" / "scenarios" / "benchmark.yaml", work / "localcloud"
        )
        bench = setup(args, work, cloud)
        if MAIN in args.design:
            bench.main_plugins = export_tree(args.main_ref, work / "tree-main")
            log(f"design {MAIN!r}: interlude from git ref {args.main_ref!r} ({bench.main_plugins})")
        if args.gcs_state == "training":
            keys = [p["run_key"] for p in bench.placements]
            bench.writer = ProgressWriter(cloud.gcs_endpoint, cloud.project, BUCKET, keys, args.poll_interval).start()
            log(f"rewriting {len(keys)} stages' progress.json once per {args.poll_interval:g} s each")
        return [measure(bench, args, design, i) for i, design in enumerate(args.design)]
    finally:
        if bench is not None and bench.writer is not None:
            bench.writer.stop()
        for proxy in bench.proxies if bench is not None else []:
            proxy.stop()
        if cloud is not None:
            cloud.stop()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


ROWS: list[tuple[str, Any]] = [
    ("triggers polled / assigned", lambda r: f"{r['triggers_polled']} / {r['triggers_assigned']}"),
    (
        "window from / to (s after first polls)",
        lambda r: f"{r['window_start_s']:g} / {r['window_start_s'] + r['window_s']:.0f}",
    ),
    ("load average (1 min) start / end", lambda r: "{:.1f} / {:.1f}".format(*r["load_1m"])),
    ("all polled once after", lambda r: f"{r['ramp_up_s']:g} s"),
    ("task instances", lambda r: ", ".join(f"{k} {v}" for k, v in r["task_instance_states"].items())),
    ("idle triggerer", lambda r: f"{r['idle']['cpu_pct']:.1f}% CPU, RSS {r['idle']['rss_mb']:.0f} MB"),
    ("triggerer CPU (tree)", lambda r: f"{r['cpu_pct']:.1f}% ({r['cpu_pct_above_idle']:.1f} above idle)"),
    ("- supervisor process", lambda r: f"{r['cpu_split_pct']['supervisor_process']:.1f}%"),
    ("- runner event-loop thread", lambda r: f"{r['cpu_split_pct']['runner_event_loop_thread']:.1f}%"),
    ("- runner other threads (GCS)", lambda r: f"{r['cpu_split_pct']['runner_other_threads_gcs_reads']:.1f}%"),
    ("RSS above idle", lambda r: f"{r['rss_above_idle_mb']:.0f} MB ({r['kb_per_trigger_rss']:.0f} KB/trigger)"),
    (
        "- supervisor / trigger runner",
        lambda r: "{supervisor_process:.0f} / {trigger_runner:.0f} MB (at the end)".format(
            **r["rss_above_idle_split_mb"]
        ),
    ),
    ("PSS above idle", lambda r: f"{r['pss_above_idle_mb']:.0f} MB"),
    ("TPU API calls/min", lambda r: f"{r['tpu_api_calls_per_min']:g}"),
    ("GCS calls/min", lambda r: f"{r['gcs_calls_per_min']:g}"),
    ("- of which lists", lambda r: f"{r['gcs_lists_per_min']:g}"),
    ("GCS calls per trigger per min", lambda r: f"{r['gcs_calls_per_trigger_per_min']:g}"),
    ("progress rewrites/min (training)", lambda r: f"{r.get('progress_writes_per_min', 0):g}"),
]


def report(results: list[dict[str, Any]]) -> str:
    """The designs side by side, one column each; then the steady-state windows, if measured, the same way."""
    text = _table(results, "first window after the first polls")
    steady = [r["steady"] for r in results if "steady" in r]
    return text if not steady else text + "\n\n" + _table(steady, "steady state")


def _table(results: list[dict[str, Any]], what: str) -> str:
    r0 = results[0]
    head = (
        f"StageTrigger watch benchmark ({what}): {r0['machines']} machines, {r0['zones']} zone(s), poll every "
        f"{r0['poll_interval_s']:g} s, window {r0['window_s']:g} s, {r0['cores']} cores, GCS facts: {r0['gcs_state']}"
    )
    table = [["", *(r["design"] for r in results)], *([label, *(f(r) for r in results)] for label, f in ROWS)]
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    lines = [head, *("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in table)]
    for r in results:
        lines.append(
            f"  {r['design']} calls/min by kind: " + ", ".join(f"{k} {v:g}" for k, v in r["calls_per_min"].items())
        )
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
        choices=("none", "progress", "checkpoint", "training"),
        default="checkpoint",
        help="what each stage has in GCS: nothing, progress.json, or progress + a checkpoint (quiet stages: the "
        "startup-script looks), or training: progress + a checkpoint and every progress.json rewritten once per "
        "poll interval, as running workloads do (benchmarks/progress_writer.py)",
    )
    p.add_argument("--idle-seconds", type=float, default=10.0, help="window for the idle triggerer's CPU")
    p.add_argument(
        "--warm-up",
        type=float,
        default=0.0,
        help="extra seconds between the first polls and the window (beyond one poll interval): 0 measures the "
        "first minute, when every silent stage makes its first startup-script look; a few minutes measure the "
        "steady state after the looks backed off",
    )
    p.add_argument(
        "--steady-at",
        type=float,
        default=0.0,
        help="also measure a steady-state window this many seconds after the first polls, in the same triggerer "
        "after the first window (0: none; 300 is past the quiet stages' first three startup-script looks)",
    )
    p.add_argument(
        "--steady-seconds",
        type=float,
        default=150.0,
        help="the steady-state window: 150 s is one cycle of a quiet stage's looks at the default stall timeout "
        "(600 s / 4), so every stage's look counts once whether or not the looks are spread",
    )
    p.add_argument(
        "--main-ref",
        default="main",
        help=f"git ref whose plugins/interlude the {MAIN!r} design runs (exported into the work dir with git archive)",
    )
    p.add_argument(
        "--settle", type=float, default=5.0, help="seconds after the triggerer is up before the idle sampling"
    )
    p.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        help="seconds for every trigger to poll once after the rows are written",
    )
    p.add_argument(
        "--design",
        type=lambda v: [d for d in v.split(",") if d],
        default=[d for d in DESIGNS if d != MAIN],
        help=f"watch designs to run in sequence, comma-separated, each in a fresh triggerer: {', '.join(DESIGNS)}",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, airflow.db)")
    args = p.parse_args(argv)
    if unknown := sorted(set(args.design) - set(DESIGNS)):
        p.error(f"unknown design(s) {unknown}; choose from {list(DESIGNS)}")
    if args.steady_at and args.steady_at < args.poll_interval + args.warm_up + args.seconds:
        p.error("--steady-at must come after the first window (poll interval + --warm-up + --seconds)")
    # SIGTERM (a `kill`, a timeout) unwinds like Ctrl-C: the finally blocks stop the triggerer's process group, the
    # proxies and the local cloud. Without it the triggerer (its own session) outlived the benchmark and kept
    # polling beside the next run's measurement.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    results = run(args)
    print(report(results))
    print("RESULT " + json.dumps({"designs": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
