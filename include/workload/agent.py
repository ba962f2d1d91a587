"""The machine's agent: run every stage the control plane has planned, in order, resuming each.

Started by the startup script on every boot (see startup.py). It is the one starter of the
workload on a machine, so there are never two copies writing checkpoints. A stage whose final
step is committed finishes at once (the trainer exits 0), so after a reboot the agent walks past
finished stages to the one that was interrupted. SIGTERM (the machine going down) is passed to the
trainer, which commits its current step, and the agent then stops instead of starting the next stage.

A machine of a `fresh` run knows its run's fresh token (from the startup script): plans left in GCS by
an earlier run with the same run id carry another token and are not this machine's work, so they are
neither run nor counted as done; the run's own plan (same object, rewritten) is picked up when it lands.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from types import FrameType

from interlude_workload.plan import read_plans

USAGE_ERROR = 2  # the trainer's exit code for bad arguments or missing data: deterministic
MAX_FAILURES = 3


class Agent:
    def __init__(self, bucket: str, run_key: str, idle_poll: float, fresh_token: str | None = None) -> None:
        self.bucket, self.run_key, self.idle_poll = bucket, run_key, idle_poll
        self.fresh_token = fresh_token
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def _on_term(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        if self.child and self.child.poll() is None:
            self.child.send_signal(signum)

    def _report_failure(self, stage: str, rc: int, attempts: int) -> None:
        from interlude_workload.checkpoints import CheckpointStore

        store = CheckpointStore(self.bucket, self.run_key, stage)
        progress = store.read_progress() or {}
        error = f"trainer exited {rc} after {attempts} attempt(s); see the machine's serial log"
        store.write_progress({**progress, "state": "failed", "error": progress.get("error") or error})
        print(f"agent: stage {stage} failed: {error}", flush=True)

    def _ours(self, plan_token: str | None) -> bool:
        """A fresh run's machine runs only plans of its own token (None: a resume run takes any plan)."""
        return self.fresh_token is None or plan_token == self.fresh_token

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        done: set[tuple[str, str | None]] = set()
        failures: dict[str, int] = {}
        while not self.stopping:
            pending = [p for p in read_plans(self.bucket, self.run_key)
                       if (p.stage, p.fresh_token) not in done and self._ours(p.fresh_token)]
            if not pending:
                time.sleep(self.idle_poll)  # the next stage is planned when Airflow reaches it
                continue
            plan = pending[0]
            args = plan.trainer_args(self.bucket, self.run_key)
            argv = [sys.executable, "-m", "interlude_workload.train", *args]
            print(f"agent: starting stage {plan.stage}", flush=True)
            self.child = subprocess.Popen(argv)
            rc = self.child.wait()
            if self.stopping:
                break
            if rc != 0:
                failures[plan.stage] = failures.get(plan.stage, 0) + 1
                if rc == USAGE_ERROR or failures[plan.stage] >= MAX_FAILURES:
                    # Retrying cannot help: say so where the control plane looks, then stay idle.
                    self._report_failure(plan.stage, rc, failures[plan.stage])
                    done.add((plan.stage, plan.fresh_token))
                    continue
                print(f"agent: stage {plan.stage} exited {rc}; retrying in {self.idle_poll}s", flush=True)
                time.sleep(self.idle_poll)
                continue
            done.add((plan.stage, plan.fresh_token))
        print("agent: stopping", flush=True)
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--run-key", required=True)
    parser.add_argument("--idle-poll", type=float, default=1.0)
    parser.add_argument("--fresh-token", default=None, help="run only plans carrying this token")
    args = parser.parse_args(argv)
    return Agent(args.bucket, args.run_key, args.idle_poll, args.fresh_token).run()


if __name__ == "__main__":
    sys.exit(main())
