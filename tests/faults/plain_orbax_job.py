"""A user's own training job, as a MaxText-style trainer is written: numpy and plain Orbax, no Interlude code.

It checkpoints with ``ocp.CheckpointManager`` into the directory it is given, resumes from the latest step there
(or starts from another directory's latest, the previous stage's), and on SIGTERM saves the step it is at and exits
(what MaxText does on a preemption). Its log is the test's independent account: every step it computed
(``computed step N``), every restore and save, each stop on SIGTERM (``stopped on SIGTERM after step N``: only a
SIGTERM it received writes it), any crash of its own (Python's traceback) and the digest of its final weights.

Run by tests/faults/test_user_job.py through ``workload_command``; :func:`advance` is also the test's uninterrupted
reference.
"""

from __future__ import annotations

import argparse
import hashlib
import signal
import sys
import time

import numpy as np

SHAPE = (32, 64)


def initial(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(SHAPE).astype(np.float32)


def advance(w: np.ndarray, step: int) -> np.ndarray:
    """One deterministic "training step" (the same bits on every run)."""
    grad = np.tanh(w) * np.float32(0.01) + np.float32(step % 7) * np.float32(1e-3)
    return (w - grad).astype(np.float32)


def digest(w: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(w).tobytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--init-from", default="")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--checkpoint-every", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args()

    import orbax.checkpoint as ocp

    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))

    def manager(root: str) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(root, item_names=("state",), options=ocp.CheckpointManagerOptions(max_to_keep=3))

    def restore(m: ocp.CheckpointManager, step: int) -> np.ndarray:
        restored = m.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))
        return np.asarray(restored["state"]["w"], np.float32)

    mgr = manager(args.checkpoint_dir)
    latest = mgr.latest_step()
    if latest is not None:
        w, start = restore(mgr, latest), latest
        print(f"restored step {latest}", flush=True)
    elif args.init_from and (base := manager(args.init_from)).latest_step() is not None:
        w, start = restore(base, int(base.latest_step())), 0
        print(f"initialised from {args.init_from} step {base.latest_step()}", flush=True)
    else:
        w, start = initial(args.seed), 0
        print("initialised from seed", flush=True)

    step = start
    while step < args.steps and not stop["requested"]:
        began = time.monotonic()
        step += 1
        w = advance(w, step)
        print(f"computed step {step}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": w})))
            mgr.wait_until_finished()
            print(f"saved step {step}", flush=True)
            if step == args.steps:  # said before the stage can see the commit and tear the machine down
                print(f"final digest {digest(w)}", flush=True)
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))
    if stop["requested"]:
        if mgr.latest_step() != step:
            mgr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": w})), force=True)
            mgr.wait_until_finished()
            print(f"saved step {step} on SIGTERM", flush=True)
        print(f"stopped on SIGTERM after step {step}, latest saved step {mgr.latest_step()}", flush=True)
    mgr.close()
    return 143 if stop["requested"] else 0


if __name__ == "__main__":
    sys.exit(main())
