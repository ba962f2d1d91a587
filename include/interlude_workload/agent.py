"""The machine's agent: run every stage the control plane has planned, in order, resuming each.

Started by the startup script on every boot (see startup.py). It is the one starter of the
workload on a machine, so there are never two copies writing checkpoints. A stage whose final
step is committed finishes at once (the trainer exits 0), so after a reboot the agent walks past
finished stages to the one that was interrupted. SIGTERM (the machine going down) is passed to the
trainer, which commits its current step, and the agent then stops instead of starting the next stage.

Each stage's trainer is started warm: the agent imports the trainer's modules once and forks, and the child
runs the trainer's ``main`` (see warm.py: ~1 s less before a machine trains again after a maintenance);
``--cold-start`` (or any other thread in the agent) starts ``python -m interlude_workload.train`` instead.
A plan with a ``command`` runs the user's own job instead of the trainer (see job.py: a job that checkpoints
with plain Orbax, watched and stopped for checkpoints by the agent).

It never dies silently: an error (GCS unreachable while listing plans, a trainer that cannot start)
is printed to the serial console, written to the run's ``agent.json`` heartbeat when GCS answers,
and retried with capped exponential backoff and jitter. Only SIGTERM ends it.

A machine of a `fresh` run knows its run's fresh token (from the startup script): plans left in GCS by
an earlier run with the same run id carry another token and are not this machine's work, so they are
neither run nor counted as done; the run's own plan (same object, rewritten) is picked up when it lands.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from interlude_workload import lean

if __name__ == "__main__":  # the machine's agent: before google-cloud-storage is imported (see lean.py)
    lean.skip_optional_imports()

from interlude_workload import layout, warm
from interlude_workload.boot import BOOT_ID_ENV, BOOT_STARTED_ENV
from interlude_workload.gcs import skip_bucket_metadata_lookups
from interlude_workload.plan import StagePlan, read_plans

if TYPE_CHECKING:
    from interlude_workload.job import UserJob

USAGE_ERROR = 2  # the trainer's exit code for bad arguments, missing data or an export that fails: deterministic
MAX_FAILURES = 3
MAX_BACKOFF = 60.0
GCS_CALL_SECONDS = 15.0  # the storage library's own retries per call, before the agent says so and backs off


def backoff(attempt: int, base: float, cap: float = MAX_BACKOFF, rng: random.Random | None = None) -> float:
    """Full-jitter exponential backoff (attempt 1-based): many machines must not retry in lockstep."""
    ceiling = min(cap, max(base, 0.1) * 2 ** min(attempt - 1, 16))
    return (rng or random).uniform(ceiling / 2, ceiling)


class Agent:
    def __init__(
        self, bucket: str, run_key: str, idle_poll: float, fresh_token: str | None = None, warm_start: bool = True
    ) -> None:
        self.bucket, self.run_key, self.idle_poll = bucket, run_key, idle_poll
        self.fresh_token = fresh_token
        self.warm_start = warm_start
        self.child: subprocess.Popen[bytes] | warm.ForkedTrainer | UserJob | None = None
        self.stopping = False
        self.done: set[tuple[str, str | None]] = set()
        self.failures: dict[str, int] = {}

    def _on_term(self, signum: int, _frame: FrameType | None) -> None:
        # No lock here (an Event.set() would take one): the handler runs in the main thread, which may hold it.
        self.stopping = True
        if self.child is not None:
            self.child.send_signal(signum)  # both kinds check their own returncode first

    def _pause(self, seconds: float) -> None:
        """Sleep up to ``seconds``, ending within 0.2 s of SIGTERM (the handler only sets ``stopping``)."""
        deadline = time.monotonic() + seconds
        while not self.stopping and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))

    def heartbeat(self, **fields: Any) -> None:
        """Best effort: the serial console has the same words when GCS is what fails."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        from interlude_workload.boot import boot_id
        from interlude_workload.gcs import storage_client

        body = {"boot_id": boot_id(), "updated_at_epoch": time.time(), **fields}
        try:
            storage_client().bucket(self.bucket).blob(layout.agent_object(self.run_key)).upload_from_string(
                json.dumps(body, sort_keys=True),
                content_type="application/json",
                retry=DEFAULT_RETRY.with_timeout(GCS_CALL_SECONDS),
                timeout=GCS_CALL_SECONDS,
            )
        except Exception as exc:  # noqa: BLE001 - reporting must not stop the agent
            print(f"agent: heartbeat not written ({type(exc).__name__}: {exc})", flush=True)

    def _report_failure(self, stage: str, rc: int, attempts: int) -> None:
        from interlude_workload.checkpoints import CheckpointStore

        store = CheckpointStore(self.bucket, self.run_key, stage)
        progress = store.read_progress() or {}
        error = f"trainer exited {rc} after {attempts} attempt(s); see the machine's serial log"
        store.write_progress({**progress, "state": "failed", "error": progress.get("error") or error})
        print(f"agent: stage {stage} failed: {error}", flush=True)

    def _start_trainer(self, args: list[str]) -> subprocess.Popen[bytes] | warm.ForkedTrainer:
        """Warm (a fork of this process, which imported the trainer) when it is safe, else as a command."""
        self.child = None  # the last stage's trainer is reaped: nothing may signal its pid any more
        if self.warm_start and warm.can_fork():
            return warm.start(args)
        return subprocess.Popen([sys.executable, "-m", "interlude_workload.train", *args])

    def _run_stage(self, plan: StagePlan) -> None:
        print(f"agent: starting stage {plan.stage}", flush=True)
        if plan.command:  # the user's own job (plain Orbax): interlude_workload.job stands in for the SDK
            from interlude_workload.job import UserJob

            self.child = None
            self.child = UserJob(plan, self.bucket, self.run_key)
        else:
            self.child = self._start_trainer(plan.trainer_args(self.bucket, self.run_key))
        if self.stopping:  # SIGTERM came while it started: the handler may have had no child to forward it to
            self.child.send_signal(signal.SIGTERM)
        self.heartbeat(state="running", stage=plan.stage)  # after the start: the restore need not wait for it
        rc = self.child.wait()
        if self.stopping:
            return
        if rc == 0:
            self.done.add((plan.stage, plan.fresh_token))
            return
        self.failures[plan.stage] = self.failures.get(plan.stage, 0) + 1
        if rc == USAGE_ERROR or self.failures[plan.stage] >= MAX_FAILURES:
            # Retrying cannot help: say so where the control plane looks, then stay idle.
            self._report_failure(plan.stage, rc, self.failures[plan.stage])
            self.done.add((plan.stage, plan.fresh_token))
            return
        wait = backoff(self.failures[plan.stage], self.idle_poll)
        print(f"agent: stage {plan.stage} exited {rc}; retrying in {wait:.1f}s", flush=True)
        self._pause(wait)

    def _once(self) -> None:
        from google.cloud.storage.retry import DEFAULT_RETRY

        plans = read_plans(self.bucket, self.run_key, retry=DEFAULT_RETRY.with_timeout(GCS_CALL_SECONDS))
        pending = [p for p in plans if (p.stage, p.fresh_token) not in self.done and self._ours(p.fresh_token)]
        if not pending:
            self._pause(self.idle_poll)  # the next stage is planned when Airflow reaches it
            return
        self._run_stage(pending[0])

    def _ours(self, plan_token: str | None) -> bool:
        """A fresh run's machine runs only plans of its own token (None: a resume run takes any plan)."""
        return self.fresh_token is None or plan_token == self.fresh_token

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        errors = 0
        while not self.stopping:
            try:
                self._once()
                errors = 0
            except Exception as exc:  # noqa: BLE001 - never die silently: say it, back off, try again
                errors += 1
                wait = backoff(errors, self.idle_poll)
                message = f"{type(exc).__name__}: {exc}"[:500]
                print(f"agent: error #{errors} ({message}); retrying in {wait:.1f}s", flush=True)
                self.heartbeat(state="retrying", error=message, errors=errors)
                self._pause(wait)
        print("agent: stopping", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--run-key", required=True)
    parser.add_argument("--idle-poll", type=float, default=1.0)
    parser.add_argument("--fresh-token", default=None, help="run only plans carrying this token")
    parser.add_argument(
        "--cold-start",
        action="store_true",
        help="start each trainer as a new interpreter (python -m interlude_workload.train) instead of a fork",
    )
    args = parser.parse_args(argv)
    skip_bucket_metadata_lookups()
    if not args.cold_start:
        warm.preload()
    if os.environ.get(BOOT_ID_ENV) and not os.environ.get(BOOT_STARTED_ENV):
        # A pod (GKE): its uid is the boot id (the JobSet's downward API env) and no startup script stamps the
        # start; the agent's start is the boot's (the kernel's uptime would be the node's, not this pod's).
        os.environ[BOOT_STARTED_ENV] = repr(time.time())
    return Agent(args.bucket, args.run_key, args.idle_poll, args.fresh_token, warm_start=not args.cold_start).run()


if __name__ == "__main__":
    sys.exit(main())
