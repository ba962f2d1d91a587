"""`make demo-serve`: serve the fine-tuned model of `make demo` with vLLM on the local cloud's GKE.

Continues from the training demo (runs it first when its fine-tuned model is not there): its Hugging Face export
(config.json, model.safetensors, tokenizer files) is what vLLM loads - the TPU image streams it from gs:// with the
Run:ai streamer, the L4 image (no GCS streamer) reads it through a Cloud Storage FUSE volume - and the smoke
answer must be the export's own greedy completion, computed here from the same files. The training
cloud's Cloud Storage is copied into a local cloud whose GKE cluster is Google's TPU-first / L4-fallback
serving example (scenario gke_serving_demo: a TPU v6e pool of one node, an L4 pool), and the
`interlude_serving` DAG runs three times with Airflow's `dags test`:

1. **deploy during a TPU stockout** - every TPU scale-up fails; GKE would wait up to 10 hours (the scenario's
   TPU fallback wait), Interlude's rollout falls back to GPU-first and the replica is Ready on L4;
2. **TPU capacity is back: deploy again + load** - the ComputeClass goes back to TPU-first, a bounded load runs
   through the Service, the HPA adds replicas (they land on L4: the TPU pool holds one node), and the TPU
   node gets a scheduled maintenance while the load runs (Interlude cordons, surges, drains, starts it early);
3. **delete** - nothing of the serving spec left; then the local cloud stops and no pod process may remain.

One run cannot do both 1 and 2: the fallback acts in the rollout, and the maintenance drill after it, while
going back to TPU-first is what the next deploy does. Prints the DAGs' serving reports and what the demo saw
in the Kubernetes API itself (pods per accelerator over time), and where the logs are.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo
from serve_witness import Seen, Witness, first_stockout, processes_of

from interlude_dev import wiring as dev
from interlude_localcloud.gke.policy.autoscaler import DEFAULT_BACKOFF_SECONDS

DAG_ID = "interlude_serving"
CLUSTER = "interlude-serving"
ZONE = "us-central1-a"
TPU_MACHINE = "ct6e-standard-1t"
SCENARIO = dev.SCENARIOS / "gke_serving_demo.yaml"
#: Every run: quick polls, and a fallback after 30 s (cluster clock) of TPU pods pending on a stockout.
COMMON = {"poll_seconds": 1, "fallback_after_seconds": 30, "rollout_timeout_seconds": 600, "replicas_max": 4}
#: The second run's drill: a bounded load (count and time) while the watch handles the TPU node's maintenance.
#: 8 in flight: one replica (2 sequence slots in the stand-in) queues 6, so the HPA (target 0.5 waiting) goes to
#: its maximum of 4 - one on the TPU node, the rest on L4 - and 4 replicas then leave none waiting (a quiet moment).
DRILL = {"watch_minutes": 1.25, "load_requests": 4000, "load_concurrency": 8, "hpa_target_waiting": 0.5}
#: The maintenance is announced once the TPU replica has answered the load and the HPA's replicas reached L4
#: (or, at the latest, this long after the TPU replica first answered).
SCALE_OUT_WAIT_SECONDS = 30
#: The TPU node's maintenance (cluster seconds): announced now, window in an hour, 60 s long, node kept.
MAINTENANCE = {"notice_in": 0, "window_in": 3600, "duration_seconds": 60}


@dataclass
class RunOutcome:
    name: str
    state: str | None
    seconds: float
    log: Path
    xcoms: dict[str, Any] = field(default_factory=dict)


@dataclass
class ServeOutcome:
    """What one demo run did and saw: the runs, the witness, the stockout figure, what was left."""

    runs: list[RunOutcome]
    seen: Seen
    stockout_to_gpu_ready: float | None  # cluster seconds
    maintained_node: str | None
    pods_left: list[str]
    processes_left: list[int]
    var: Path
    expected_answer: str | None = None  # the export's greedy completion of the smoke prompt, computed here

    @property
    def answers(self) -> list[str]:
        return [r.xcoms["smoke"]["text"] for r in self.runs if "smoke" in r.xcoms]

    @property
    def ok(self) -> bool:
        return (
            all(r.state == "success" for r in self.runs)
            and len(self.runs) == 3
            and not self.pods_left
            and not self.processes_left
            and bool(self.answers)
            and all(a == self.expected_answer for a in self.answers)
        )


def finetuned() -> dict[str, str] | None:
    """The training demo's fine-tuned model, if its record and its Cloud Storage are still on disk."""
    if not (demo.FINETUNED.exists() and (demo.VAR / "localcloud" / "gcs").is_dir()):
        return None
    return dict(json.loads(demo.FINETUNED.read_text()))


def model_uri(record: dict[str, str]) -> str:
    """The Hugging Face export the training demo recorded (the record's `export_uri`; `checkpoint_uri` in a
    record from before exports, which vLLM cannot load)."""
    return record.get("export_uri") or record["checkpoint_uri"]


def export_answer(uri: str, cloud: dev.LocalCloud) -> str:
    """The export's greedy completion of the smoke prompt: its files read from the serving cloud's Cloud Storage
    and run through the workload's numpy forward, as the answer served must be."""
    import tempfile

    from tokenizers import Tokenizer

    from interlude.operators.serving import SMOKE_MAX_TOKENS, SMOKE_PROMPT
    from interlude_workload.llm.config import EOS_ID
    from interlude_workload.llm.numpy_forward import greedy_generate, load_export

    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    with tempfile.TemporaryDirectory(prefix="demo-serve-export-") as tmp:
        for blob in dev.gcs_client(cloud).list_blobs(bucket, prefix=prefix.rstrip("/") + "/", delimiter="/"):
            blob.download_to_filename(str(Path(tmp) / blob.name.rsplit("/", 1)[-1]))
        weights, config = load_export(tmp)
        tok = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    new = greedy_generate(weights, config, tok.encode(SMOKE_PROMPT).ids, SMOKE_MAX_TOKENS)
    return str(tok.decode(new[:-1] if new and new[-1] == EOS_ID else new, skip_special_tokens=True))


def xcoms(db: Path, run_id: str) -> dict[str, Any]:
    """Every task's return value of one run, from Airflow's DB."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT task_id, value FROM xcom WHERE dag_id = ? AND run_id = ? AND key = 'return_value'",
            (DAG_ID, run_id),
        ).fetchall()
    out = {}
    for task_id, raw in rows:
        value = json.loads(raw)
        out[task_id] = json.loads(value) if isinstance(value, str) else value
    return out


def run_dag(env: dict[str, str], name: str, conf: dict[str, Any], var: Path) -> RunOutcome:
    log = var / f"dags-test-{name}.log"
    print(f"\n== {name}: airflow dags test {DAG_ID} (log: {log})", flush=True)
    started = time.monotonic()
    result = dev.dags_test(env, DAG_ID, conf, log, timeout=900)
    took = time.monotonic() - started
    print(f"   {result.state} after {took:.0f} s", flush=True)
    found = xcoms(Path(env["AIRFLOW_HOME"]) / "airflow.db", result.run_id) if result.run_id else {}
    outcome = RunOutcome(name, result.state, took, log, found)
    report = found.get("report")
    if report:
        print(report["text"])
    return outcome


@contextmanager
def kube_api(env: dict[str, str], cloud: dev.LocalCloud) -> Iterator[Any]:
    """A kubernetes client for the cluster, through the same connection the DAG uses."""
    os.environ["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"] = env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"]
    from interlude.hooks.gke import GKEHook

    hook = GKEHook(location="us-central1")
    with hook.kubernetes_hook(CLUSTER, project_id=cloud.project).get_conn() as api:
        yield api


def maintain_tpu_node_under_load(witness: Witness, dag: threading.Thread, cloud: dev.LocalCloud) -> str | None:
    """Once the TPU replica answers the load, schedule its node's maintenance (as Google would); the node."""
    deadline, serving_since = time.monotonic() + 300, None
    while dag.is_alive() and time.monotonic() < deadline:
        target = witness.tpu_replica_under_load()
        serving_since = serving_since or (time.monotonic() if target else None)
        scaled_out = witness.ready_now().get("gpu", 0) > 0
        if target and (scaled_out or time.monotonic() - serving_since > SCALE_OUT_WAIT_SECONDS):
            pod, node = target
            cloud.admin.gke_node_maintenance(CLUSTER, node, **MAINTENANCE)
            print(
                f"   TPU node {node} (serving {pod} under load; Ready replicas {witness.ready_now()}): "
                "scheduled maintenance announced",
                flush=True,
            )
            return node
        time.sleep(0.5)
    return None


def stockout_deploy(env: dict[str, str], cloud: dev.LocalCloud, uri: str, var: Path) -> RunOutcome:
    cloud.admin.gke_stockout(ZONE, TPU_MACHINE)
    print(f"\nTPU stockout: every scale-up of {TPU_MACHINE} in {ZONE} fails (GKE's TPU fallback wait: 10 h)")
    outcome = run_dag(env, "1-deploy-in-tpu-stockout", {**COMMON, "checkpoint_uri": uri}, var)
    cloud.admin.gke_stockout(ZONE, TPU_MACHINE, stockout=False)
    # The cluster autoscaler backs a node pool off after a failed scale-up (5 minutes at first): until then new
    # replicas would still go to L4. Wait it out, on the scenario's clock, before the TPU-first deploy.
    backoff = DEFAULT_BACKOFF_SECONDS / float(yaml.safe_load(SCENARIO.read_text())["time_scale"])
    print(f"TPU capacity is back (stockout cleared); the TPU pool's scale-up backoff ends in {backoff:.0f} s")
    time.sleep(backoff)
    return outcome


def drill(
    env: dict[str, str], cloud: dev.LocalCloud, uri: str, var: Path, witness: Witness
) -> tuple[RunOutcome, str | None]:
    box: dict[str, RunOutcome] = {}
    conf = {**COMMON, **DRILL, "checkpoint_uri": uri}
    dag = threading.Thread(target=lambda: box.update(r=run_dag(env, "2-deploy-load-maintenance", conf, var)))
    dag.start()
    node = maintain_tpu_node_under_load(witness, dag, cloud)
    dag.join()
    return box["r"], node


def copy_export(uri: str, gcs_dir: Path, cloud: dev.LocalCloud) -> list[str]:
    """Copy a Hugging Face export's files (the objects directly under `uri`) from the training cloud's Cloud
    Storage (its emulator's data directory, served again for the copy) into the serving cloud's, by name (as
    `gcloud storage cp` would); their names relative to `uri`, empty when `uri` holds no `config.json`."""
    from interlude_localcloud.gcs import GcsEmulator
    from interlude_workload.gcs import storage_client

    bucket, _, prefix = uri.removeprefix("gs://").partition("/")
    dev.ensure_bucket(cloud, bucket)
    target = dev.gcs_client(cloud).bucket(bucket)
    source = GcsEmulator(0, gcs_dir)
    source.start()
    try:
        client = storage_client(project=cloud.project, emulator=source.endpoint)
        top = prefix.rstrip("/") + "/"
        names = [b.name for b in client.list_blobs(bucket, prefix=top, delimiter="/")]
        if top + "config.json" not in names:
            return []
        for name in names:  # by name: a listed blob's mediaLink names the port of the emulator that wrote it
            target.blob(name).upload_from_string(client.bucket(bucket).blob(name).download_as_bytes())
    finally:
        source.stop()
    return [name.removeprefix(top) for name in names]


def serve(uri: str, gcs_dir: Path, var: Path, airflow_home: Path) -> ServeOutcome:
    """The serving part of the demo on a fresh local cloud, serving `uri` copied from the Cloud Storage data in
    `gcs_dir` (the training cloud's)."""
    shutil.rmtree(var / "localcloud", ignore_errors=True)
    var.mkdir(parents=True, exist_ok=True)
    cloud = dev.start_localcloud(SCENARIO, var / "localcloud")
    runs: list[RunOutcome] = []
    gpu_ready, node, pods_left, answer = None, None, ["?"], None
    try:
        print(
            f"local cloud: {cloud.api_endpoint} (GKE cluster {CLUSTER}, time_scale {cloud.time_scale:g}); "
            f"state in {var}"
        )
        copied = copy_export(uri, gcs_dir, cloud)
        if "config.json" not in copied:  # a checkpoint (a record from before exports): vLLM could not load it
            raise ValueError(f"{uri} holds no Hugging Face model directory (config.json): run `make demo` again")
        print(f"copied {len(copied)} objects of {uri} into the serving cloud's Cloud Storage")
        answer = export_answer(uri, cloud)
        print(f"the export's own greedy answer to the smoke prompt: {answer!r}")
        env = dev.airflow_env(airflow_home, cloud)
        dev.ensure_airflow_db(env)
        with kube_api(env, cloud) as api:
            witness = Witness(api, cloud.admin, CLUSTER).start()
            runs.append(stockout_deploy(env, cloud, uri, var))
            stockout, ready = first_stockout(cloud.admin, CLUSTER), witness.seen.first_gpu_ready_cluster
            gpu_ready = ready - stockout if stockout is not None and ready is not None else None
            if runs[-1].state == "success":
                run, node = drill(env, cloud, uri, var, witness)
                runs.append(run)
            runs.append(run_dag(env, "3-delete", {"action": "delete"}, var))
            seen = witness.stop()
            pods_left = [p.metadata.name for p in witness.look()]
    finally:
        cloud.stop()
    time.sleep(1)
    return ServeOutcome(runs, seen, gpu_ready, node, pods_left, processes_of(var / "localcloud"), var, answer)


def summary(out: ServeOutcome) -> str:
    lines = ["", "Interlude serving demo (what the demo saw in the Kubernetes API, besides the DAGs' reports)"]
    lines.append("  Ready serving pods per accelerator over time (s since the first run started):")
    lines += [f"    {t:6.1f} s  {counts or '{}'}" for t, counts in out.seen.timeline]
    per_pod: dict[str, int] = {}
    for kind in out.seen.ready_on.values():
        per_pod[kind] = per_pod.get(kind, 0) + 1
    lines.append(
        f"  pods that were Ready, per accelerator: {per_pod}; peak at once: "
        f"tpu {out.seen.peak('tpu')}, gpu {out.seen.peak('gpu')}; most serving pods on one node: {out.seen.per_node}"
    )
    if out.stockout_to_gpu_ready is not None:
        lines.append(
            f"  TPU stockout -> GPU replica Ready: {out.stockout_to_gpu_ready:.0f} s of cluster time "
            "(goal < 120 s; GKE's own TPU wait: up to 10 h)"
        )
    load = next(
        (r.xcoms.get("maintenance_watch", {}).get("load") for r in out.runs if "maintenance_watch" in r.xcoms), None
    )
    if load:
        lines.append(
            f"  load during the TPU node maintenance ({out.maintained_node}): {load['sent']} requests sent, "
            f"{load['failed']} failed, p50 {load['p50_seconds'] * 1000:.0f} ms, p99 {load['p99_seconds'] * 1000:.0f} ms"
        )
    same = bool(out.answers) and all(a == out.expected_answer for a in out.answers)
    lines.append(
        f"  smoke answers {out.answers}: {'the' if same else 'NOT the'} export's own greedy completion "
        f"{out.expected_answer!r}"
    )
    lines.append("  runs: " + ", ".join(f"{r.name} {r.state} in {r.seconds:.0f} s" for r in out.runs))
    lines.append(
        f"  serving pods left after delete: {out.pods_left or 'none'}; "
        f"pod processes left after the local cloud stopped: {out.processes_left or 'none'}"
    )
    lines.append(
        f"  logs: {out.var}/dags-test-*.log (Airflow), {out.var}/localcloud/localcloud.log, "
        f"pods' container logs {out.var}/localcloud/gke/{CLUSTER}/pods/*/"
    )
    return "\n".join(lines)


def main() -> int:
    record = finetuned()
    if record is None:
        print("No fine-tuned model from `make demo` on disk: running the training demo first.\n")
        if demo.main() != 0 or (record := finetuned()) is None:
            print("the training demo failed: nothing to serve")
            return 1
    print(f"\nServing the fine-tuned model's export {model_uri(record)}")
    started = time.monotonic()
    out = serve(
        model_uri(record),
        demo.VAR / "localcloud" / "gcs",
        demo.ROOT / "var" / "demo-serve",
        demo.VAR / "airflow",
    )
    print(summary(out))
    print(f"serving demo: {'OK' if out.ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
