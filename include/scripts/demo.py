"""`make demo`: one full train + fine-tune run on the local cloud, with maintenance in both stages.

Starts the local cloud (TPU/Compute REST APIs + a GCS emulator on 127.0.0.1), runs the lifecycle DAG
with Airflow's own `dags test`, rehearsing a scheduled maintenance event in each stage through the
real `simulateMaintenanceEvent` method, then prints the run report and checks that no machine of
the run is left.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from interlude import dev

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    var = ROOT / "var" / "demo"
    var.mkdir(parents=True, exist_ok=True)
    cloud = dev.start_localcloud("default", var / "localcloud")
    try:
        print(f"local cloud: {cloud.api_endpoint} (GCS {cloud.gcs_endpoint})")
        env = dev.airflow_env(var / "airflow", cloud)
        dev.ensure_airflow_db(env)
        conf = {"drill_maintenance": True, "train_steps": 60, "finetune_steps": 30, "checkpoint_every": 10,
                "step_seconds": 0.1, "bucket": "interlude-demo"}
        dev.ensure_bucket(cloud, conf["bucket"])
        log = var / "dags-test.log"
        print(f"running interlude_training with {json.dumps(conf)} (log: {log})")
        started = time.monotonic()
        rc = dev.dags_test(env, "interlude_training", conf, log)
        print(f"dags test exited {rc} after {time.monotonic() - started:.0f}s")
        text = log.read_text()
        report = [line for line in text.splitlines() if "Interlude run report" in line or line.startswith("  ")]
        summary = dev.summarize_run(text)
        print(summary or "\n".join(report[-20:]))
        left = dev.machines_left(cloud)
        print(f"machines left on the local cloud: {left or 'none'}")
        ok = rc == 0 and "state=success" in text.replace(" ", "") or dev.run_succeeded(text)
        return 0 if ok and not left else 1
    finally:
        cloud.stop()
        del naming


if __name__ == "__main__":
    sys.exit(main())
