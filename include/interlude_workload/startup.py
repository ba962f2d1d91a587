"""Render the startup script that runs the trainer on an accelerator machine.

The operators put the result in the machine's ``startup-script`` metadata. It runs again on every boot
(that is how a machine resumes after maintenance: the trainer finds its latest committed checkpoint), so
it must be safe to run twice: resume is the default, and a start-fresh request carries a token that is
applied once (see ``--fresh`` in :mod:`interlude_workload.train`).

What the script assumes of the machine:

* bash, and a Python (``python`` argument, default ``python3`` on PATH) that can import
  ``interlude_workload`` (a VM image with the package, or ``pip_install`` specs installed on first boot,
  e.g. a wheel copied from the bucket or ``git+https://...``); on the local cloud, ``python3`` on PATH
  is the project's virtualenv;
* the machine's service account may read/write the checkpoint bucket (real GCS) or
  ``STORAGE_EMULATOR_HOST`` is set (local cloud);
* one host per stage (a single-host TPU slice or one VM): one writer of checkpoints.

Every value is shell-quoted with :func:`shlex.quote`; nothing from parameters is interpreted by bash.
The script appends the trainer's output to a local log (``$INTERLUDE_LOG_DIR``, else the machine's dir
on the local cloud, else ``log_dir``) and to its own stdout (the machine's serial console), forwards
SIGTERM to the trainer (GCE's startup-script service may signal only the script), and exits with the
trainer's code: 0 done, 143 stopped by SIGTERM after committing, anything else a failure.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

_TEMPLATE = """#!/bin/bash
# Interlude workload startup script (rendered by interlude_workload.startup). Runs on every boot.
set -u
PYTHON={python}
STAGE={stage}
RUN_KEY={run_key}
if [ -n "${{INTERLUDE_LOG_DIR:-}}" ]; then LOG_DIR="$INTERLUDE_LOG_DIR"
elif [ -n "${{INTERLUDE_MACHINE_ID:-}}" ]; then LOG_DIR="$PWD"
else LOG_DIR={log_dir}; fi
{{ [ -d "$LOG_DIR" ] || mkdir -p "$LOG_DIR" 2>/dev/null; }} && [ -w "$LOG_DIR" ] || LOG_DIR="$PWD"
LOG="$LOG_DIR"/{log_name}
# Builtins only (printf's strftime, EPOCHREALTIME): no date or tee process before the workload starts (each is
# a fork and an exec in the time between a boot and training again).
say() {{
  local line; TZ=UTC0 printf -v line '%(%Y-%m-%dT%H:%M:%SZ)T startup: %s' -1 "$*"; echo "$line"; echo "$line" >>"$LOG"
}}
# One id per boot (the script runs once per boot): the kernel's on a real VM; a fresh one on the local
# cloud, whose machines share the host's kernel. The control plane tells boots apart by it.
if [ -z "${{INTERLUDE_BOOT_ID:-}}" ]; then
  if [ -z "${{INTERLUDE_MACHINE_ID:-}}" ] && [ -r /proc/sys/kernel/random/boot_id ]; then
    read -r INTERLUDE_BOOT_ID </proc/sys/kernel/random/boot_id
  else TZ=UTC0 printf -v INTERLUDE_BOOT_ID '%(%Y%m%dT%H%M%S)T-%s-%s%s' -1 "$$" "$RANDOM" "$RANDOM"; fi
fi
INTERLUDE_BOOT_STARTED_AT=${{EPOCHREALTIME:-}}
INTERLUDE_BOOT_STARTED_AT=${{INTERLUDE_BOOT_STARTED_AT/,/.}}  # a locale's decimal comma
[ -n "$INTERLUDE_BOOT_STARTED_AT" ] || INTERLUDE_BOOT_STARTED_AT=$(date +%s.%N 2>/dev/null || date +%s)
export INTERLUDE_BOOT_ID INTERLUDE_BOOT_STARTED_AT
say "begin: boot $INTERLUDE_BOOT_ID"
# Guest attributes (instance/guest-attributes/interlude/KEY on the metadata server): what the control plane
# reads through the TPU API's getGuestAttributes, where there is no serial console to read.
guest() {{
  local url="${{INTERLUDE_METADATA_URL:-http://metadata.google.internal/computeMetadata/v1}}"
  url="$url/instance/guest-attributes/interlude/$1"
  if command -v curl >/dev/null 2>&1; then
    curl -sf -m 5 -X PUT --data-binary @- -H 'Metadata-Flavor: Google' "$url" >/dev/null 2>&1 || true
  else
    "$PYTHON" -c 'import sys, urllib.request as u
u.urlopen(u.Request(sys.argv[1], sys.stdin.buffer.read(), {{"Metadata-Flavor": "Google"}}, method="PUT"), timeout=5)
' "$url" >/dev/null 2>&1 || true
  fi
}}
# The control plane reads the end line on the serial console (and the same words as the guest attribute
# interlude/startup): the workload is not running any more.
last_words() {{ echo "startup: begin: boot $INTERLUDE_BOOT_ID"; tail -n 12 "$LOG" | cut -c1-300; }}
# This boot's begin replaces the last boot's last words at once: they must never be read as this boot's. It is
# sent in the background (the workload need not wait for the metadata server, up to curl's 5 s), and the end
# waits for it, so the begin never lands after the end.
echo "startup: begin: boot $INTERLUDE_BOOT_ID" | guest startup &
begin_sent=$!
ended() {{ say "end (exit $1) boot $INTERLUDE_BOOT_ID"; wait "$begin_sent" 2>/dev/null; last_words | guest startup; }}
trap 'ended $?' EXIT
{exports}
if ! command -v "$PYTHON" >/dev/null 2>&1; then say "no $PYTHON on PATH"; exit 127; fi
# Start at once; only a start that fails makes us ask whether the package is there at all (one interpreter
# fewer on every boot, the time a machine spends before training again after a maintenance).
run_workload() {{
  say "boot: starting $STAGE of $RUN_KEY"
  # tee ignores SIGTERM (inherited through exec): when the machine's processes get SIGTERM, the trainer
  # must still be able to write its last lines while it commits.
  "$PYTHON" -m {module} {args} > >(trap '' TERM; exec tee -a "$LOG") 2>&1 &
  child=$!
  rc=0
  wait "$child" || rc=$?
  while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
}}
child=""
stopping=""
forward() {{
  stopping=1; say "SIGTERM: forwarding to trainer $child"; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null
}}
trap forward TERM INT
run_workload
if [ "$rc" -ne 0 ] && [ -z "$stopping" ] && ! "$PYTHON" -c 'import interlude_workload' >/dev/null 2>&1; then
{install}
  run_workload
fi
if [ "$rc" -eq 0 ]; then say "trainer finished"; else say "trainer exited with $rc"; fi
exit "$rc"
"""

_INSTALL = """  say "$PYTHON cannot import interlude_workload: installing the workload package"
  "$PYTHON" -m pip install --quiet {specs} >>"$LOG" 2>&1 || {{ say "pip install failed"; exit 3; }}
  "$PYTHON" -c 'import interlude_workload' || {{ say "interlude_workload still not importable"; exit 3; }}"""

_NO_INSTALL = """  say "$PYTHON cannot import interlude_workload (install it in the image or pass pip_install)"
  exit 3"""


def trainer_args(
    *,
    bucket: str,
    run_key: str,
    stage: str,
    steps: int,
    checkpoint_every: int,
    seed: int = 0,
    init_from_stage: str | None = None,
    data_date: str | None = None,
    data_dir: str | None = None,
    step_seconds: float = 0.0,
    keep: int = 3,
    fresh: str | None = None,
    hold_margin_seconds: float | None = None,
    hold_at_step: int | None = None,
    hold_margin_commits: float | None = None,
    periodic_only: bool = False,
    model_size: str | None = None,
) -> list[str]:
    """The trainer's command-line arguments (unquoted list)."""
    args = [
        "--bucket", bucket, "--run-key", run_key, "--stage", stage, "--steps", str(int(steps)),
        "--checkpoint-every", str(int(checkpoint_every)), "--seed", str(int(seed)), "--keep", str(int(keep)),
    ]  # fmt: skip
    optional = {
        "--init-from-stage": init_from_stage,
        "--data-date": data_date,
        "--data-dir": data_dir,
        "--fresh": fresh,
        "--step-seconds": repr(float(step_seconds)) if step_seconds else None,
        "--hold-margin-seconds": repr(float(hold_margin_seconds)) if hold_margin_seconds is not None else None,
        "--hold-at-step": str(int(hold_at_step)) if hold_at_step is not None else None,
        "--hold-margin-commits": repr(float(hold_margin_commits)) if hold_margin_commits is not None else None,
        "--model-size": model_size,
    }
    for flag, value in optional.items():
        if value is not None:
            args += [flag, str(value)]
    return [*args, "--periodic-only"] if periodic_only else args


def render(
    *,
    bucket: str,
    run_key: str,
    stage: str,
    steps: int,
    checkpoint_every: int,
    seed: int = 0,
    init_from_stage: str | None = None,
    data_date: str | None = None,
    data_dir: str | None = None,
    step_seconds: float = 0.0,
    keep: int = 3,
    fresh: str | None = None,
    hold_margin_seconds: float | None = None,
    python: str = "python3",
    log_dir: str = "/var/log/interlude",
    env: Mapping[str, str] | None = None,
    pip_install: Sequence[str] = (),
    periodic_only: bool = False,
    model_size: str | None = None,
) -> str:
    """The startup script text. ``fresh`` should be a token unique to one start-fresh request.
    ``periodic_only``: the trainer ignores notices, requests and SIGTERM (a naive baseline for benchmarks)."""
    args = trainer_args(
        bucket=bucket, run_key=run_key, stage=stage, steps=steps, checkpoint_every=checkpoint_every,
        seed=seed, init_from_stage=init_from_stage, data_date=data_date, data_dir=data_dir,
        step_seconds=step_seconds, keep=keep, fresh=fresh, hold_margin_seconds=hold_margin_seconds,
        periodic_only=periodic_only, model_size=model_size,
    )  # fmt: skip
    return _script(
        module="interlude_workload.train",
        args=args,
        stage=stage,
        run_key=run_key,
        python=python,
        log_dir=log_dir,
        env=env,
        pip_install=pip_install,
    )


def render_agent(
    *,
    bucket: str,
    run_key: str,
    idle_poll: float = 1.0,
    python: str = "python3",
    log_dir: str = "/var/log/interlude",
    env: Mapping[str, str] | None = None,
    pip_install: Sequence[str] = (),
    fresh_token: str | None = None,
) -> str:
    """The startup script the operators give a machine: the agent, which runs every planned stage
    in order and resumes each (see agent.py and plan.py). A fresh run's token makes the agent ignore
    plans an earlier run with the same run id left behind."""
    args = ["--bucket", bucket, "--run-key", run_key, "--idle-poll", repr(float(idle_poll))]
    if fresh_token:
        args += ["--fresh-token", fresh_token]
    return _script(
        module="interlude_workload.agent",
        args=args,
        stage="all-stages",
        run_key=run_key,
        python=python,
        log_dir=log_dir,
        env=env,
        pip_install=pip_install,
    )


def _script(
    *,
    module: str,
    args: Sequence[str],
    stage: str,
    run_key: str,
    python: str,
    log_dir: str,
    env: Mapping[str, str] | None,
    pip_install: Sequence[str],
) -> str:
    exports = []
    for name, value in sorted((env or {}).items()):
        if not name.isidentifier():
            raise ValueError(f"bad environment variable name {name!r}")
        exports.append(f"export {name}={shlex.quote(value)}")
    install = _INSTALL.format(specs=" ".join(shlex.quote(s) for s in pip_install)) if pip_install else _NO_INSTALL
    return _TEMPLATE.format(
        python=shlex.quote(python),
        log_dir=shlex.quote(log_dir),
        log_name=shlex.quote(f"interlude-{run_key}-{stage}.log"),
        exports="\n".join(exports),
        install=install,
        stage=shlex.quote(stage),
        run_key=shlex.quote(run_key),
        module=module,
        args=" ".join(shlex.quote(a) for a in args),
    )
