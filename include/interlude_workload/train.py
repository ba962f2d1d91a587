"""The reference trainer: ``python -m interlude_workload.train --bucket B --run-key K --stage train ...``.

It trains (stage ``train``) or fine-tunes (stage ``finetune``, starting from train's final weights and one day's
text) the small Llama of :mod:`interlude_workload.llm` in JAX, through the SDK (:mod:`interlude_workload.sdk`) like
any user's code would: resume from the latest committed Orbax checkpoint, checkpoint every N steps, on SIGTERM, on
maintenance notices and control requests, hold before a maintenance window. The state is one pytree (params,
AdamW state, data key, step; :mod:`interlude_workload.model`) saved and restored as is, so resume is
bit-identical to an uninterrupted run; the final digest (sha256 of the final weights) is printed and stored with
the final step (its Orbax step metadata: ``metrics.digest``). Once its final step is committed a fine-tune also
writes the Hugging Face model directory vLLM serves (:mod:`interlude_workload.hf_export`), verified against the JAX
model, and prints its URI: the commit first, so an export that fails costs no training (a retry restores the final
step and exports again). Exit codes: 0 done (also at once when the final step and its export are already
committed), 143 stopped by SIGTERM after committing, 2 bad input or an export that does not reproduce the model
(said in the stage's progress, where the control plane reads it), 1 other failure (an upload: the agent retries).
"""

from __future__ import annotations

import os

# Single-threaded BLAS (numpy's, in the export's check): no thread pool in the agent that imports this module
# before it forks a trainer (interlude_workload.warm), and bits that do not depend on how a matmul was split.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

from interlude_workload import data, distributed, hf_export, model  # noqa: E402
from interlude_workload.agent import USAGE_ERROR  # noqa: E402
from interlude_workload.gcs import skip_bucket_metadata_lookups  # noqa: E402
from interlude_workload.llm.train_step import DEFAULT_SIZE, SIZES  # noqa: E402
from interlude_workload.sdk import EXIT_SIGTERM, Checkpointer  # noqa: E402

MODEL_SIZE_ENV = "INTERLUDE_MODEL_SIZE"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m interlude_workload.train", description=__doc__.split("\n")[0])
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--run-key", required=True)
    parser.add_argument("--stage", required=True, choices=["train", "finetune"])
    parser.add_argument("--steps", type=int, required=True, help="total steps of this stage")
    parser.add_argument("--checkpoint-every", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-from-stage", default=None, help="take initial weights from this stage's latest")
    parser.add_argument("--data-date", default=None, help="YYYY-MM-DD: fine-tune on this day's slice")
    parser.add_argument(
        "--data-dir", default=None, help="local dir or gs://bucket/prefix with corpus.txt and finetune/DAY.txt"
    )
    parser.add_argument(
        "--model-size",
        default=os.environ.get(MODEL_SIZE_ENV) or DEFAULT_SIZE,
        choices=sorted(SIZES),
        help=f"the reference model's size (llm.train_step.SIZES): small, or tiny for smoke runs (default: "
        f"${MODEL_SIZE_ENV} or {DEFAULT_SIZE})",
    )
    parser.add_argument("--step-seconds", type=float, default=0.0, help="pace each step to take this long")
    parser.add_argument("--keep", type=int, default=3, help="committed checkpoints to keep")
    parser.add_argument(
        "--fresh",
        nargs="?",
        const="always",
        default=None,
        metavar="TOKEN",
        help="wipe this stage's checkpoints first; with TOKEN only once per token (safe in startup scripts)",
    )
    parser.add_argument(
        "--hold-margin-seconds",
        type=float,
        default=10.0,
        help="checkpoint and hold this long before a maintenance window starts",
    )
    parser.add_argument(
        "--hold-margin-commits",
        type=float,
        default=0.0,
        help="hold at least this many measured checkpoint costs (a step plus a commit) before a window",
    )
    parser.add_argument("--max-hold-seconds", type=float, default=1800.0)
    parser.add_argument(
        "--hold-at-step",
        type=int,
        default=None,
        help="commit this step and hold there until a maintenance (a drill) has come and gone",
    )
    parser.add_argument("--metadata-url", default="", help="default: $INTERLUDE_METADATA_URL or Google's")
    parser.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help=f"worker processes of the slice (default: ${distributed.NUM_WORKERS_ENV}, a TPU VM's "
        "worker-network-endpoints, else 1)",
    )
    parser.add_argument(
        "--worker-id",
        type=int,
        default=None,
        help=f"this worker's number (default: ${distributed.WORKER_ID_ENV}, a TPU VM's agent-worker-number, else 0)",
    )
    parser.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help=f"worker 0's jax.distributed coordinator (default: ${distributed.COORDINATOR_ENV}, a TPU VM's "
        f"worker 0 on port {distributed.TPU_COORDINATOR_PORT})",
    )
    parser.add_argument("--no-maintenance-watch", action="store_true")
    parser.add_argument(
        "--periodic-only",
        action="store_true",
        help="checkpoint every N steps and at the end only: no notice watch, no control requests, no commit on "
        "SIGTERM (it ends the process). The naive baseline of benchmarks/badput.py",
    )
    parser.add_argument("--control-poll-seconds", type=float, default=1.0)
    parser.add_argument(
        "--export",
        choices=["auto", "yes", "no"],
        default="auto",
        help="write the Hugging Face model directory at the final step (auto: for a finetune stage)",
    )
    parser.add_argument(
        "--async-saves",
        action="store_true",
        help="periodic saves finish in the background (Orbax's async checkpointing); every other save waits",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1:
        parser.error("--steps and --checkpoint-every must be >= 1")
    if args.fresh == "always":  # plain --fresh: a token of its own, so it wipes on every start
        args.fresh = f"always-{time.time_ns()}"
    return args


def run(args: argparse.Namespace) -> int:  # noqa: C901 - one loop read top to bottom: resume, step, commit, hold, stop
    tokens = data.load_tokens(args.data_dir or data.default_data_dir(), args.stage, args.data_date)
    from interlude_workload.maintenance import metadata_url_from_env

    watch = not (args.no_maintenance_watch or args.periodic_only)
    workers = distributed.resolve(
        args.num_workers,
        args.worker_id,
        args.coordinator,
        (args.metadata_url or metadata_url_from_env()) if watch else None,
    )
    model.use_compilation_cache()
    mesh = None
    if workers.multi:  # before JAX's first computation; one worker never starts jax.distributed
        distributed.initialize(workers)
        mesh = model.mesh_for(args.model_size)
    ckpt = Checkpointer(
        args.bucket,
        args.run_key,
        args.stage,
        total_steps=args.steps,
        checkpoint_every=args.checkpoint_every,
        keep=args.keep,
        metadata_url=None if args.no_maintenance_watch or args.periodic_only else args.metadata_url,
        hold_margin_seconds=args.hold_margin_seconds,
        hold_margin_commits=args.hold_margin_commits,
        max_hold_seconds=args.max_hold_seconds,
        control_poll_seconds=args.control_poll_seconds,
        fresh=args.fresh,
        hold_at_step=args.hold_at_step,
        handle_sigterm=not args.periodic_only,
        control_requests=not args.periodic_only,
        async_saves=args.async_saves,
        workers=workers,
    )
    with ckpt:
        if workers.multi:
            ckpt.log(f"data-parallel over {workers.describe()}, {mesh.describe() if mesh else ''}")
        restored = ckpt.start(target=model.abstract_state(args.model_size, mesh))
        if restored is not None and restored.step >= args.steps:
            digest = model.digest(restored.state)
            ckpt.log(f"final step {restored.step} already committed; nothing to do")
            if workers.primary and not _export(ckpt, args, restored.step, restored.state):
                return USAGE_ERROR
            ckpt.log(f"final digest {digest}")
            ckpt.close("done")
            return 0
        if restored is not None:
            state, start_step = restored.state, restored.step
        else:
            params = None
            if args.init_from_stage:
                source = ckpt.restore(stage=args.init_from_stage, target=model.abstract_state(args.model_size, mesh))
                if source is None:
                    ckpt.log(f"no committed checkpoint in stage {args.init_from_stage} to start from")
                    ckpt.close("failed")
                    return 2
                params = model.params_only(source.state)
                ckpt.log(f"initial weights from {args.init_from_stage} step {source.step}")
            state, start_step = model.new_state(args.stage, args.seed, params, args.model_size, mesh), 0
        ckpt.log(
            f"training {args.stage} steps {start_step + 1}..{args.steps} on {len(tokens)} tokens"
            + (f" dated {args.data_date}" if args.data_date else "")
        )
        if ckpt.stop_requested:
            ckpt.close("stopped")
            return EXIT_SIGTERM
        training = _Run(args, model.prepare(tokens, mesh), state, mesh, workers.primary)
        for step in range(start_step + 1, args.steps + 1):
            started = time.monotonic()
            training.state, loss = model.step(training.state, training.data, args.model_size, training.mesh)
            if args.step_seconds > 0:
                ckpt.pace(started, args.step_seconds)
            reason = ckpt.step_finished(step, loss=loss)
            if step % 10 == 0 or reason:
                ckpt.log(f"step {step}/{args.steps} loss {loss:.5f}")
            if reason:
                _commit(ckpt, training, step, loss, reason)
            if ckpt.stop_requested:
                return _stop(ckpt, training, step, loss, held=False)
            ckpt.wait_while_held()
            if ckpt.stop_requested:
                return _stop(ckpt, training, step, loss, held=True)
        if training.primary and not _export(ckpt, args, args.steps, training.state):
            return USAGE_ERROR
        ckpt.log(f"final digest {model.digest(training.state)}")
        ckpt.close("done")
    return 0


@dataclass
class _Run:
    """What a commit needs besides its step: the arguments, the token stream and the training state."""

    args: argparse.Namespace
    data: Any
    state: Any = field(default=None)
    mesh: distributed.Mesh | None = None
    primary: bool = True  # worker 0 (or the only one): writes the export


def _commit(ckpt: Checkpointer, run: _Run, step: int, loss: float, reason: str) -> None:
    """Commit ``step`` (the whole state, as Orbax saves a pytree); the final step also carries the weights' digest.

    The export comes after the final commit (:func:`_export`): a stage that exports is done for the control plane
    only once the export's marker is in GCS too (``hf_export.exports``), so no Asset event goes out without it."""
    extra: dict[str, object] = {"seed": run.args.seed, "data_date": run.args.data_date, "reason": reason}
    if step >= run.args.steps:
        extra["weights_sha256"] = model.digest(run.state)
    metrics = {"loss": loss, **({"digest": extra["weights_sha256"]} if "weights_sha256" in extra else {})}
    ckpt.commit(step, run.state, {}, metrics=metrics, extra=extra, reason=reason)


def _export(ckpt: Checkpointer, args: argparse.Namespace, step: int, state: Any) -> bool:
    """The committed final step's Hugging Face directory, once (a retry finds it committed and does nothing).

    False when it does not reproduce the model: said in the log and the stage's progress (the control plane fails
    the stage with these words), nothing of it marked. An upload that fails raises: the agent retries the trainer,
    which restores the committed final step and comes back here."""
    if args.export == "no" or (args.export == "auto" and args.stage not in hf_export.EXPORT_STAGES):
        return True
    from interlude_workload.gcs import storage_client
    from interlude_workload.llm.export import ExportError

    started = time.monotonic()
    try:
        result = hf_export.publish(
            storage_client(),
            args.bucket,
            args.run_key,
            args.stage,
            step=step,
            digest=model.digest(state),
            params=model.params_only(state),
            size=args.model_size,
        )
    except ExportError as exc:
        ckpt.fail(f"the Hugging Face export of committed step {step} failed its verification: {exc}")
        return False
    how = f"written and verified in {time.monotonic() - started:.1f}s" if result.written else "already committed"
    ckpt.log(f"export {result.uri} ({result.files} files) {how}")
    return True


def _stop(ckpt: Checkpointer, run: _Run, step: int, loss: float, *, held: bool) -> int:
    """Exit on SIGTERM with ``step`` committed.

    A signal can land between any two lines: after step_finished had decided there was nothing to commit,
    or just before wait_while_held. The step is then committed here, before the exit, all the same (SIGTERM
    means "commit, then exit"; stop_requested stays true once set, so no later window is left).
    """
    if ckpt.last_committed_step != step:
        _commit(ckpt, run, step, loss, "sigterm")
        held = False
    where = "while holding at committed" if held else "after committing"
    ckpt.log(f"stopped by SIGTERM {where} step {step}")
    ckpt.close("stopped")
    return EXIT_SIGTERM


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    skip_bucket_metadata_lookups()
    try:
        return run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
