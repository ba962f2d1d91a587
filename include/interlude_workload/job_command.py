"""The command line of a user's own job (``workload_command``): which placeholders it may name, and its argv.

Why a command and placeholders: a team's trainer (MaxText, their own JAX loop) already checkpoints with Orbax and
handles SIGTERM; it needs to be told where its stage's checkpoints live and how far to train, nothing more. The
command is an argv list, never a shell string: it is run without a shell, and a placeholder is replaced inside one
argument, so nothing in a param is ever interpreted by bash. Pure (no GCS, no Orbax): the control plane checks a
command with :func:`problems` before anything is provisioned, and the agent renders it with :func:`render`.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence

PLACEHOLDERS: dict[str, str] = {
    "checkpoint_dir": "the stage's Orbax CheckpointManager root, gs://BUCKET/interlude/RUN_KEY/STAGE/checkpoints",
    "init_from_dir": "the previous stage's checkpoint root to start from (empty for the first stage)",
    "steps": "the stage's total steps: the job exits 0 once this step is committed",
    "checkpoint_every": "the periodic checkpoint interval, in steps",
    "seed": "the run's seed",
    "stage": "the stage's name (train, finetune)",
    "run_key": "the run's key (its prefix in the bucket)",
    "bucket": "the run's bucket",
    "data_date": "the fine-tuning data slice (YYYY-MM-DD; empty for the first stage)",
}
ENV_PREFIX = "INTERLUDE_JOB_"  # each placeholder is also in the job's environment: INTERLUDE_JOB_CHECKPOINT_DIR, ...
MAX_ARGS = 64
MAX_ARG_CHARS = 1024


def _fields(arg: str) -> list[str]:
    """The placeholder names in one argument; ValueError for a malformed one ('{', '}', a format spec)."""
    names: list[str] = []
    for _literal, name, spec, conversion in string.Formatter().parse(arg):
        if name is None:
            continue
        if spec or conversion:
            raise ValueError(f"{{{name}}} carries a format spec or conversion")
        names.append(name)
    return names


def problems(command: Sequence[str], param: str = "workload_command") -> list[str]:
    """Every problem of a command, each naming the param (empty list: the command is fine)."""
    if not command:
        return []
    out: list[str] = []
    if len(command) > MAX_ARGS:
        out.append(f"{param}: at most {MAX_ARGS} arguments (got {len(command)})")
    if not command[0].strip():
        out.append(f"{param}: the first argument (the program) is empty")
    for index, arg in enumerate(command[:MAX_ARGS]):
        if len(arg) > MAX_ARG_CHARS:
            out.append(f"{param}[{index}]: longer than {MAX_ARG_CHARS} characters")
            continue
        try:
            unknown = [name for name in _fields(arg) if name not in PLACEHOLDERS]
        except ValueError as exc:
            out.append(
                f"{param}[{index}]: {exc}; write a literal brace as {{{{ or }}}}, placeholders as {{checkpoint_dir}}"
            )
            continue
        for name in unknown:
            out.append(f"{param}[{index}]: unknown placeholder {{{name}}} (known: {', '.join(PLACEHOLDERS)})")
    return out


def render(command: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """The argv to run: each placeholder replaced inside its argument (a checked command: see :func:`problems`)."""
    missing = set(PLACEHOLDERS) - set(values)
    if missing:
        raise ValueError(f"no value for {sorted(missing)}")
    return [arg.format_map(dict(values)) for arg in command]


def environment(values: Mapping[str, str]) -> dict[str, str]:
    """The same values as environment variables (INTERLUDE_JOB_CHECKPOINT_DIR, ...), for jobs that read those."""
    return {ENV_PREFIX + name.upper(): str(value) for name, value in values.items()}
