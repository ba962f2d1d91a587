"""`make demo`: one full train + fine-tune run on the local cloud, with maintenance in both stages.

Starts the local cloud (TPU/Compute REST APIs + a GCS emulator on 127.0.0.1), runs the lifecycle DAG
with Airflow's own `dags test`, rehearsing a scheduled maintenance event in each stage through the
real `simulateMaintenanceEvent` method, then prints the run report and checks that no machine of
the run is left.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from interlude import naming
from interlude.training import events
from interlude_dev import wiring as dev

ROOT = Path(__file__).resolve().parents[2]
VAR = ROOT / "var" / "demo"
#: What `make demo-serve` continues from: the run's fine-tuned checkpoint (written after a successful run).
FINETUNED = VAR / "finetuned.json"
CONF = {
    "drill_maintenance": True,
    "train_steps": 200,
    "finetune_steps": 150,
    "checkpoint_every": 10,
    "step_seconds": 0.1,
    "data_date": "2024-01-15",
    "bucket": "interlude-demo",
}


def main() -> int:
    var = VAR
    FINETUNED.unlink(missing_ok=True)
    var.mkdir(parents=True, exist_ok=True)
    # A fresh local cloud every time: its GCS emulator slows down as objects pile up, and a demo should
    # not depend on what an earlier one left.
    shutil.rmtree(var / "localcloud", ignore_errors=True)
    cloud = dev.start_localcloud("default", var / "localcloud")
    try:
        print(f"local cloud: {cloud.api_endpoint} (GCS {cloud.gcs_endpoint}); state in {var}")
        env = dev.airflow_env(var / "airflow", cloud)
        dev.ensure_airflow_db(env)
        dev.ensure_bucket(cloud, CONF["bucket"])
        log = var / "dags-test.log"
        print(f"running interlude_training with {json.dumps(CONF)}\n  (Airflow log: {log})")
        started = time.monotonic()
        result = dev.dags_test(env, "interlude_training", CONF, log)
        print(f"dag run {result.run_id}: {result.state} after {time.monotonic() - started:.0f}s")
        if result.run_id is None:
            print(f"no DAG run finished; see {log}")
            return 1
        report = dev.read_report(cloud, CONF["bucket"], naming.run_key("interlude_training", result.run_id))
        same = False
        if report:
            print(events.render_report(report))
            digest = report["stages"][-1].get("digest")
            same = digest == dev.reference_digest(cloud, CONF["bucket"], CONF)
            print(f"final weights bit-identical to an uninterrupted run: {'yes' if same else 'NO'} (sha256 {digest})")
        left = dev.machines(cloud)
        print(f"machines left on the local cloud: {[m['name'] for m in left] or 'none'}")
        ok = bool(result.succeeded and report and same and not left)
        if ok and report:
            final = report["stages"][-1]
            record = {"bucket": CONF["bucket"], "checkpoint_uri": final["final_uri"]}
            if final.get("export_uri"):
                record["export_uri"] = final["export_uri"]
            FINETUNED.write_text(json.dumps(record))
        return 0 if ok else 1
    finally:
        cloud.stop()


if __name__ == "__main__":
    sys.exit(main())
