"""The bodies of the lifecycle DAG's tasks: params in, small JSON out, one function per task.

The DAG file only wires these together. Each function is safe to run again: it reads what exists
(capacity, checkpoints, machines named by the run key) and returns the same answer, so a retry or a
clear resumes rather than redoes.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from interlude import naming

log = logging.getLogger(__name__)

GCP_CONN_ID = "google_cloud_default"
STAGES = ("train", "finetune")


class RunSpecError(ValueError):
    """Bad input, found before anything is provisioned."""


def resolve_run(params: Mapping[str, Any], dag_id: str, run_id: str, data_date: str | None) -> dict[str, Any]:
    """Validate the params and fix the names this run will use everywhere."""
    from interlude.profiles import get_profile

    problems: list[str] = []
    try:
        get_profile(str(params["model_profile"]))
    except KeyError as exc:
        problems.append(str(exc.args[0]))
    for key in ("train_steps", "finetune_steps", "checkpoint_every"):
        if int(params[key]) < 1:
            problems.append(f"{key} must be at least 1 (got {params[key]})")
    if int(params["checkpoint_every"]) > int(params["train_steps"]):
        problems.append("checkpoint_every must not exceed train_steps")
    if not params.get("zones"):
        problems.append("zones must list at least one zone")
    data_date = str(params.get("data_date") or "") or data_date
    try:
        from interlude_workload import data

        data.load(data.default_data_dir(), "finetune", data_date)
    except ValueError as exc:
        problems.append(f"fine-tuning data: {exc} (set the data_date param, or run over dates the data covers)")
    bucket = str(params["bucket"])
    if not (3 <= len(bucket) <= 63) or not all(c.islower() or c.isdigit() or c in "-_." for c in bucket):
        problems.append(f"bucket {bucket!r} is not a valid bucket name")
    if problems:
        raise RunSpecError("invalid parameters:\n  - " + "\n  - ".join(problems))
    key = naming.run_key(dag_id, run_id)
    # `fresh`: wipe this run's checkpoints once. The token is made here, and a cleared downstream step
    # reuses this task's result, so a retry resumes; re-running the whole run (a reprocessing backfill
    # reuses the run id) makes a new token and starts over.
    fresh_token = uuid.uuid4().hex if params.get("resume_policy") == "fresh" else None
    spec = {**dict(params), "dag_id": dag_id, "run_id": run_id, "run_key": key, "data_date": data_date,
            "zones": list(params["zones"]), "fresh_token": fresh_token}
    log.info("Run %s -> run_key %s; checkpoints under gs://%s/%s", run_id, key, bucket, naming.checkpoint_prefix(key))
    return spec


def _hooks() -> tuple[Any, Any]:
    from interlude.hooks.compute import ComputeHook
    from interlude.hooks.tpu import TpuHook

    return TpuHook(gcp_conn_id=GCP_CONN_ID), ComputeHook(gcp_conn_id=GCP_CONN_ID)


def evaluate_capacity(spec: Mapping[str, Any], stockouts: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    from interlude.capacity import probe_capacity
    from interlude.profiles import get_profile

    profile = get_profile(spec["model_profile"])
    tpu_types = sorted({c.accelerator_type for c in profile.tpu_candidates})
    gpu_types = sorted({c.accelerator_type for c in (*profile.gpu_candidates, *profile.smaller_gpus)})
    tpu, compute = _hooks()
    report = probe_capacity(tpu, compute, spec["zones"], tpu_types, gpu_types, stockouts or [])
    log.info("Capacity report:\n%s", report.table())
    return report.to_dict()


def decide(spec: Mapping[str, Any], report: Mapping[str, Any], wait: Any = None) -> dict[str, Any]:
    from interlude.capacity import CapacityReport
    from interlude.decisions import decide as walk
    from interlude.profiles import get_profile

    decision = walk(CapacityReport.from_dict(report), get_profile(spec["model_profile"]), spec["strategy"],
                    dt.datetime.now(dt.UTC), wait)
    log.info("%s", decision.trail_text())
    return decision.to_dict()


def fail_stuck(decision: Mapping[str, Any]) -> None:
    raise RuntimeError("No accelerator can be had for this run.\n\n" + str(decision.get("stuck_report") or decision))


def validate_runtime(spec: Mapping[str, Any], decision: Mapping[str, Any]) -> dict[str, Any]:
    """Chosen hardware x runtime x framework, against the table and the zone's live runtime list."""
    from interlude import runtimes

    accel, zone = decision["accelerator_type"], decision["zone"]
    if decision["kind"] == "tpu":
        tpu, _ = _hooks()
        offered = tpu.list_runtime_versions(zone)
        requested = spec.get("tpu_runtime_version") or None
    else:
        offered = None
        requested = spec.get("gpu_image") or None
    check = runtimes.validate(accel, requested, spec.get("framework") or None,
                              spec.get("framework_version") or None, offered)
    if not check.ok:
        raise RunSpecError(check.message())
    log.info("Runtime check passed: %s on %s in %s (%s)", check.runtime, accel, zone, spec.get("framework"))
    return {"decision": dict(decision), "runtime": check.runtime}


def provision(spec: Mapping[str, Any], validated: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """Create or adopt the machine. A stockout marks that zone x type out and walks the tree again;
    a quota error waits for quota (other runs finishing) instead of failing the run."""
    from interlude import provisioning
    from interlude.capacity import CapacityReport, mark_stockout
    from interlude.hooks.errors import QuotaExceededError, StockoutError

    decision, runtime = dict(validated["decision"]), validated["runtime"]
    if spec.get("spot"):
        decision["mode"] = "spot"
    current = CapacityReport.from_dict(report)
    tried: list[str] = []
    quota_deadline = time.monotonic() + float(spec.get("quota_wait_seconds", 600))
    while True:
        request = provisioning.machine_request(
            decision, runtime, bucket=spec["bucket"], run_key=spec["run_key"], dag_id=spec["dag_id"],
            network=spec.get("network") or None, subnetwork=spec.get("subnetwork") or None,
            service_account=spec.get("service_account") or None, idle_poll=float(spec.get("poll_seconds", 1.0)))
        log.info("Provisioning %s %s in %s (%s, %s)", request.kind, request.name, request.zone,
                 request.accelerator_type, request.mode)
        try:
            provisioning.create(request.to_dict(), GCP_CONN_ID)
            log.info("Machine ready: %s (%s in %s)", request.name, request.accelerator_type, request.zone)
            return request.to_dict()
        except StockoutError as exc:
            tried.append(f"{decision['accelerator_type']} in {decision['zone']}: {exc}")
            log.warning("Stockout: %s; walking the tree again without it", exc)
            current = mark_stockout(current, decision["zone"], decision["accelerator_type"])
            new = decide(spec, current.to_dict())
            if new["leaf"] in ("wait", "stuck"):
                raise RuntimeError("Out of capacity after stockouts:\n  " + "\n  ".join(tried) + "\n\n"
                                   + str(new.get("stuck_report") or new)) from exc
            runtime = validate_runtime(spec, new)["runtime"]
            decision = {**new, "mode": "spot"} if spec.get("spot") else new
        except QuotaExceededError as exc:
            if time.monotonic() > quota_deadline:
                raise
            log.warning("Quota exhausted (%s): waiting for quota to free up", exc)
            time.sleep(min(30.0, float(spec.get("poll_seconds", 1.0)) * 10))
        except Exception:
            # Whatever was half-created must not outlive this task: the teardown of a failed setup
            # does not run.
            log.exception("Provisioning %s failed; deleting whatever was created", request.name)
            try:
                provisioning.delete(request.to_dict(), GCP_CONN_ID)
            except Exception:  # noqa: BLE001 - the original failure is what the user must see
                log.exception("Clean-up of %s failed too", request.name)
            raise


def teardown(spec: Mapping[str, Any]) -> list[str]:
    from interlude import provisioning

    deleted = provisioning.teardown_run(spec["run_key"], list(spec["zones"]), GCP_CONN_ID)
    log.info("Deleted %d resource(s) of run %s: %s (checkpoints kept under gs://%s/%s)", len(deleted),
             spec["run_key"], deleted, spec["bucket"], naming.checkpoint_prefix(spec["run_key"]))
    return deleted


def run_report(spec: Mapping[str, Any], machine: Mapping[str, Any], stages: list[Mapping[str, Any]]) -> dict[str, Any]:
    from interlude import events
    from interlude_workload.checkpoints import CheckpointStore

    rows = []
    for result in stages:
        store = CheckpointStore(spec["bucket"], spec["run_key"], result["stage"])
        progress = store.read_progress() or {}
        rows.append({
            "stage": result["stage"], "steps": result["steps"], "final_uri": result["final_uri"],
            "started_at": float(progress.get("stage_started_at") or progress.get("started_at") or 0.0),
            "finished_at": float(progress.get("updated_at_epoch") or time.time()),
            "mean_step_seconds": float(progress.get("mean_step_seconds") or spec.get("step_seconds") or 0.0),
            "digest": (result.get("metrics") or {}).get("digest"),
        })
    report = events.build_report(run_key=spec["run_key"], placement=dict(machine), stages=rows,
                                 events=events.load_events(spec["bucket"], spec["run_key"]))
    uri = events.write_report(spec["bucket"], spec["run_key"], report)
    log.info("%s\n  report: %s", events.render_report(report), uri)
    return {"uri": uri, "steps_recomputed": report["steps_recomputed"], "events": len(report["events"]),
            "goodput": report["goodput"]}
