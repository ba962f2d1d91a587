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
from dataclasses import dataclass
from typing import Any

from interlude import naming
from interlude.hooks.machines import machine_hooks
from interlude.machines import gke
from interlude.training.spec import RunSpec, RunSpecError

log = logging.getLogger(__name__)

GCP_CONN_ID = "google_cloud_default"
STAGES = ("train", "finetune")


def resolve_run(params: Mapping[str, Any], dag_id: str, run_id: str, interval_date: str | None) -> dict[str, Any]:
    """Check the params (shapes first, then what only the cloud can answer) and fix the run's names.

    Everything later reads the returned RunSpec; nothing is created before this task succeeds.
    """
    from interlude.training import preflight
    from interlude_workload import data
    from interlude_workload.gcs import storage_client

    key = naming.run_key(dag_id, run_id)
    # `fresh`: wipe this run's checkpoints once. The token is made here, and a cleared downstream step
    # reuses this task's result, so a retry resumes; re-running the whole run (a reprocessing backfill
    # reuses the run id) makes a new token and starts over.
    spec = RunSpec.from_params(params, dag_id=dag_id, run_id=run_id, run_key=key)
    if spec.resume_policy == "fresh":
        spec = spec.replace(fresh_token=uuid.uuid4().hex)
    if spec.data_date is None:
        spec = spec.replace(data_date=interval_date)
    try:
        data.load_text(data.default_data_dir(), "finetune", spec.data_date)
    except ValueError as exc:
        raise RunSpecError(
            [
                f"data_date: {exc} (set the data_date param, or point INTERLUDE_DATA_DIR at data "
                "that covers the run's dates)"
            ]
        ) from exc
    tpu, compute = machine_hooks(GCP_CONN_ID)
    preflight.check(spec, compute, storage_client())
    if gke.chosen(spec):
        gke.preflight(spec, GCP_CONN_ID)
    log.info(
        "Run %s -> run_key %s; checkpoints under gs://%s/%s", run_id, key, spec.bucket, naming.checkpoint_prefix(key)
    )
    return spec.to_dict()


def evaluate_capacity(spec: RunSpec, stockouts: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    from interlude.capacity.probe import probe_capacity

    profile = spec.profile()
    tpu_types = sorted({c.accelerator_type for c in profile.tpu_candidates})
    gpu_types = sorted({c.accelerator_type for c in (*profile.gpu_candidates, *profile.smaller_gpus)})
    tpu, compute = machine_hooks(GCP_CONN_ID)
    report = probe_capacity(
        tpu, compute, list(spec.zones), tpu_types, gpu_types, stockouts or [], platforms=gke.platforms(spec)
    )
    log.info("Capacity report:\n%s", report.table())
    return report.to_dict()


def decide(spec: RunSpec, report: Mapping[str, Any], wait: Any = None) -> dict[str, Any]:
    from interlude.capacity.decisions import decide as walk
    from interlude.capacity.report import CapacityReport

    decision = walk(
        CapacityReport.from_dict(report),
        spec.profile(),
        spec.strategy,
        dt.datetime.now(dt.UTC),
        wait,
        platforms=gke.platforms(spec),
    )
    log.info("%s", decision.trail_text())
    return decision.to_dict()


def fail_stuck(decision: Mapping[str, Any]) -> None:
    raise RuntimeError("No accelerator can be had for this run.\n\n" + str(decision.get("stuck_report") or decision))


def validate_runtime(spec: RunSpec, decision: Mapping[str, Any]) -> dict[str, Any]:
    """Chosen hardware x runtime x framework, against the table and the zone's live runtime list."""
    from interlude import runtimes

    accel, zone, platform = decision["accelerator_type"], decision["zone"], decision.get("platform")
    if platform == "gke":  # the image is the runtime (its shape checked with the params); the cluster's version
        _check_gke_version(spec, decision)
        log.info("Runtime on GKE: image %s for %s in %s", spec.gke_image, accel, zone)
        return {"decision": dict(decision), "runtime": spec.gke_image}
    offered = None
    if decision["kind"] == "tpu" and platform == "compute":  # a Compute Engine TPU VM boots an OS image
        param, requested = "tpu_image", spec.tpu_image
    elif decision["kind"] == "tpu":
        tpu, _ = machine_hooks(GCP_CONN_ID)
        offered = tpu.list_runtime_versions(zone)
        param, requested = "tpu_runtime_version", spec.tpu_runtime_version
    else:
        param, requested = "gpu_image", spec.gpu_image
    check = runtimes.validate(accel, requested, spec.framework, spec.framework_version, offered, platform=platform)
    if not check.ok:
        raise RunSpecError([f"{param} / framework: {check.message()}"])
    log.info("Runtime check passed: %s on %s in %s (%s)", check.runtime, accel, zone, spec.framework)
    return {"decision": dict(decision), "runtime": check.runtime}


def _check_gke_version(spec: RunSpec, decision: Mapping[str, Any]) -> None:
    """A TPU node pool the cluster's GKE version predates is refused before it is asked for, naming gke_cluster."""
    from interlude.runtimes.gke import version_problem
    from interlude.stage.jobset import SHAPES

    shape = SHAPES.get(decision["accelerator_type"]) if decision["kind"] == "tpu" else None
    if shape is None:
        return
    version, autopilot = gke.cluster_version(spec, GCP_CONN_ID)
    if (problem := version_problem(shape.accelerator, version, autopilot)) is not None:
        raise RunSpecError([f"gke_cluster: {spec.gke_cluster}: {problem}"])


def _machine(spec: RunSpec, decision: Mapping[str, Any], runtime: str) -> Any:
    from interlude.machines import provisioning

    return provisioning.machine_record(
        dict(decision),
        runtime,
        bucket=spec.bucket,
        run_key=spec.run_key,
        dag_id=spec.dag_id,
        run_id=spec.run_id,
        network=spec.network,
        subnetwork=spec.subnetwork,
        service_account=spec.service_account,
        idle_poll=spec.poll_seconds,
        fresh_token=spec.fresh_token,
    )


def start_fresh(spec: RunSpec) -> dict[str, int]:
    """`fresh`: wipe each stage of the run once per token, before any machine exists.

    Done here, not only on the machine: a stage watcher started on the old final checkpoint would call
    the stage done before the machine's wipe. The marker is read strictly (an unknown raises), so only
    a marker GCS positively reports as absent or different leads to a wipe.
    """
    from interlude_workload.checkpoints import CheckpointStore

    wiped: dict[str, int] = {}
    if not spec.fresh_token:
        return wiped
    for stage in STAGES:
        store = CheckpointStore(spec.bucket, spec.run_key, stage)
        if store.fresh_token() == spec.fresh_token:
            continue
        wiped[stage] = store.wipe()
        store.set_fresh_token(spec.fresh_token)
        log.info("Start fresh (token %s): removed %d object(s) of stage %s", spec.fresh_token, wiped[stage], stage)
    return wiped


def take_machine_slot(spec: RunSpec, state: dict[str, Any]) -> str | None:
    """Hold one of the deployment's machine slots before anything is created (interlude.machines.slots).

    Returns None when the run holds a slot (or there is no cap), else why it must wait; raises once it
    waited longer than ``queue_wait_seconds`` (no wait is endless). ``state`` carries the wait's start.
    """
    from interlude.machines import slots as machine_slots

    cap = machine_slots.max_machines()
    if not cap:
        return None
    index = machine_slots.take(spec.bucket, spec.run_key, spec.dag_id, spec.run_id, cap)
    if index is not None:
        log.info("Machine slot %d of %d held by this run until its teardown", index, cap)
        return None
    since = float(state.setdefault("slot_wait_since", time.time()))
    holders = ", ".join(s.run_key for s in machine_slots.holders(spec.bucket))
    if time.time() - since > spec.queue_wait_seconds:
        raise RuntimeError(
            f"no machine slot freed in {spec.queue_wait_seconds:.0f}s (queue_wait_seconds): all {cap} "
            f"([interlude] max_machines) are held by {holders}"
        )
    return f"all {cap} machine slots ([interlude] max_machines) are held by {holders}"


def record_intent(spec: RunSpec, machine: Mapping[str, Any]) -> None:
    """Before the create call: where the machine will be, so teardown deletes it even if this task dies."""
    from interlude.machines import ledger

    uri = ledger.record(spec.bucket, spec.run_key, ledger.intent_for(dict(machine), spec.dag_id, spec.run_id))
    log.info("Intent recorded before the create: %s", uri)


def provision(spec: RunSpec, validated: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """Provision in place (CLI, tests): the same attempts as the DAG's deferrable ProvisionOperator, but
    the queued-resource and quota waits sleep here instead of deferring."""
    from interlude.machines import provisioning

    start_fresh(spec)
    decision = dict(validated["decision"])
    if spec.spot:
        decision["mode"] = "spot"
    state = {
        "decision": decision,
        "runtime": validated["runtime"],
        "report": dict(report),
        "tried": [],
        "quota_deadline": time.time() + spec.quota_wait_seconds,
    }
    while (held := take_machine_slot(spec, state)) is not None:
        log.warning("%s: waiting for a machine slot to free", held)
        time.sleep(min(30.0, spec.poll_seconds * 10))
    while True:
        attempt = create_or_queue(spec, state)
        if attempt.quota is not None:
            log.warning("Quota exhausted (%s): waiting for quota to free up", attempt.quota)
            time.sleep(min(30.0, spec.poll_seconds * 10))
            continue
        assert attempt.machine is not None
        if attempt.queued:
            # adopts the queued resource, waits for its node
            provisioning.create(
                attempt.machine, GCP_CONN_ID, queue_timeout=spec.queue_wait_seconds + provisioning.QUEUE_GRACE_SECONDS
            )
        return attempt.machine


@dataclass
class Attempt:
    """What one provisioning attempt came to: a ready machine, an accepted queued resource, or a quota wait.

    ``state`` carries the walk forward across deferrals (decision, runtime, capacity report, stockouts met).
    """

    state: dict[str, Any]
    machine: dict[str, Any] | None = None
    queued: bool = False
    quota: str | None = None


def _after_stockout(spec: RunSpec, state: dict[str, Any], exc: Exception) -> None:
    from interlude.capacity.report import CapacityReport, mark_stockout

    decision = state["decision"]
    state["tried"] = [*state["tried"], f"{decision['accelerator_type']} in {decision['zone']}: {exc}"]
    log.warning("Stockout: %s; walking the tree again without it", exc)
    current = mark_stockout(
        CapacityReport.from_dict(state["report"]),
        decision["zone"],
        decision["accelerator_type"],
        decision.get("platform"),
    )
    state["report"] = current.to_dict()
    new = decide(spec, state["report"])
    if new["leaf"] in ("wait", "stuck"):
        raise RuntimeError(
            "Out of capacity after stockouts:\n  "
            + "\n  ".join(state["tried"])
            + "\n\n"
            + str(new.get("stuck_report") or new)
        ) from exc
    state["runtime"] = validate_runtime(spec, new)["runtime"]
    state["decision"] = {**new, "mode": "spot"} if spec.spot else new


def create_or_queue(spec: RunSpec, state: dict[str, Any]) -> Attempt:
    """Create (or adopt) the machine, or get its queued resource accepted; never sleeps.

    A stockout marks that zone x type out and walks the tree again; a quota error before the quota
    deadline comes back as an Attempt to wait on (the caller defers); anything else deletes whatever
    was half-created and raises. The intent record is written before every create call.
    """
    from interlude.hooks.errors import QuotaExceededError, StockoutError
    from interlude.machines import provisioning

    while state["decision"].get("platform") == "gke":  # a node pool and the JobSet, named from the run key
        try:
            return Attempt(state, gke.provision(spec, gke.machine_record(spec, state["decision"]), GCP_CONN_ID))
        except StockoutError as exc:  # GKE's pool create met GCE_STOCKOUT: the pool is deleted, walk the tree
            _after_stockout(spec, state, exc)
    while True:
        machine = _machine(spec, state["decision"], state["runtime"]).to_dict()
        log.info(
            "Provisioning %s %s in %s (%s, %s)",
            machine["kind"],
            machine["name"],
            machine["zone"],
            machine["accelerator_type"],
            machine["mode"],
        )
        record_intent(spec, machine)
        try:
            if machine["mode"] == "queued":
                provisioning.queue(machine, GCP_CONN_ID, valid_for=spec.queue_wait_seconds)
                return Attempt(state, machine, queued=True)
            provisioning.create(machine, GCP_CONN_ID)
            log.info("Machine ready: %s (%s in %s)", machine["name"], machine["accelerator_type"], machine["zone"])
            return Attempt(state, machine)
        except StockoutError as exc:
            _after_stockout(spec, state, exc)
        except QuotaExceededError as exc:
            if time.time() > float(state["quota_deadline"]):
                raise
            return Attempt(state, quota=str(exc))
        except Exception:
            # Whatever was half-created must not outlive this task (teardown deletes it too).
            log.exception("Provisioning %s failed; deleting whatever was created", machine["name"])
            try:
                provisioning.delete(machine, GCP_CONN_ID)
            except Exception:
                log.exception("Clean-up of %s failed too", machine["name"])
            raise


def teardown(spec: RunSpec) -> list[str]:
    """Delete everything of the run in every zone it could have touched; fail unless that is confirmed."""
    from interlude.machines import ledger
    from interlude.machines.teardown import TeardownIncomplete, teardown_run

    try:
        intents = ledger.read(spec.bucket, spec.run_key)
        ledger_error = None
    except Exception as exc:  # noqa: BLE001 - the zones are still swept; the task fails below
        intents, ledger_error = [], f"{type(exc).__name__}: {exc}"
    report = teardown_run(spec.run_key, list(spec.zones), GCP_CONN_ID, intents)
    if gke.chosen(spec):  # the JobSet (its Jobs and pods) and the node pool the run created
        on_gke = gke.teardown(spec, GCP_CONN_ID)
        report.deleted += on_gke.deleted
        report.failed.update({f"gke:{i}": why for i, why in enumerate(on_gke.problems)})
    log.info(
        "Deleted %d resource(s) of run %s in zones %s: %s (checkpoints kept under gs://%s/%s)",
        len(report.deleted),
        spec.run_key,
        report.zones,
        report.deleted,
        spec.bucket,
        naming.checkpoint_prefix(spec.run_key),
    )
    if ledger_error:
        report.unlisted["(intent records)"] = ledger_error
    if not report.complete:
        raise TeardownIncomplete(spec.run_key, report)
    _release_machine_slot(spec)
    return report.deleted


def _release_machine_slot(spec: RunSpec) -> None:
    """Nothing of the run is left: its machine slot goes to the next run (a failure here fails teardown,
    whose retry releases it: a slot never leaks silently)."""
    from interlude.machines import slots as machine_slots

    if not machine_slots.max_machines():
        return  # no cap in this deployment: no slot was taken
    freed = machine_slots.release(spec.bucket, spec.run_key)
    if freed:
        log.info("Machine slot(s) %s released", freed)


def sweep(zones: list[str], state_of: Any, gke_clusters: list[str] | None = None) -> list[str]:
    """The sweeper DAG's task: delete machines of finished runs in ``zones``, and node pools of finished runs in
    ``gke_clusters`` (``LOCATION/CLUSTER``); fail on any zone, cluster or delete it could not do."""
    from interlude.machines.gke_sweep import CLUSTER_RE, sweep_clusters
    from interlude.machines.teardown import TeardownIncomplete, sweep_finished
    from interlude.training.spec_checks import ZONE_RE

    bad = [z for z in zones if not ZONE_RE.match(z)]
    if bad:
        raise ValueError(f"zones: {bad} are not zone names")
    clusters = list(gke_clusters or [])
    bad = [c for c in clusters if not isinstance(c, str) or not CLUSTER_RE.match(c)]
    if bad:
        raise ValueError(f"gke_clusters: {bad} are not LOCATION/CLUSTER (e.g. us-central1/train)")
    tpu, compute = machine_hooks(GCP_CONN_ID)
    report = sweep_finished(zones, state_of, tpu, compute)
    if clusters:
        on_gke = sweep_clusters(clusters, state_of, GCP_CONN_ID)
        report.deleted += on_gke.deleted
        report.unlisted.update(on_gke.unlisted)
        report.failed.update(on_gke.failed)
    log.info("Sweeper deleted %d machine(s) of finished runs: %s", len(report.deleted), report.deleted)
    if not report.complete:
        raise TeardownIncomplete("(sweeper)", report)
    return report.deleted


def _provisioning_started_at(spec: RunSpec) -> float | None:
    """When the run's first machine create was about to be sent (its intent record), or None if unreadable."""
    from interlude.machines import ledger

    try:
        intents = ledger.read(spec.bucket, spec.run_key)
    except Exception:
        log.warning("Could not read the run's machine intents: the report starts at the first step", exc_info=True)
        return None
    return min((i.recorded_at for i in intents), default=None)


def run_report(spec: RunSpec, machine: Mapping[str, Any], stages: list[Mapping[str, Any]]) -> dict[str, Any]:
    from interlude.training import events
    from interlude_workload.checkpoints import CheckpointStore

    rows = []
    for result in stages:
        store = CheckpointStore(spec.bucket, spec.run_key, result["stage"])
        progress = store.read_progress() or {}
        rows.append(
            {
                "stage": result["stage"],
                "steps": result["steps"],
                "final_uri": result["final_uri"],
                **({"export_uri": result["export_uri"]} if result.get("export_uri") else {}),
                "started_at": float(progress.get("stage_started_at") or progress.get("started_at") or 0.0),
                "finished_at": float(progress.get("updated_at_epoch") or time.time()),
                "mean_step_seconds": float(progress.get("mean_step_seconds") or spec.step_seconds),
                "digest": (result.get("metrics") or {}).get("digest"),
            }
        )
    report = events.build_report(
        run_key=spec.run_key,
        machine=dict(machine),
        stages=rows,
        events=events.load_events(spec.bucket, spec.run_key),
        provisioning_started_at=_provisioning_started_at(spec),
    )
    uri = events.write_report(spec.bucket, spec.run_key, report)
    log.info("%s\n  report: %s", events.render_report(report), uri)
    return {
        "uri": uri,
        "steps_recomputed": report["steps_recomputed"],
        "events": len(report["events"]),
        "goodput": report["goodput"],
        # The machine the run ended on (after any failover move), not the one `provision` made first.
        "machine": {k: machine.get(k) for k in ("kind", "name", "zone", "accelerator_type")},
    }
