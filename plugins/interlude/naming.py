"""Run naming: the one mapping from an Airflow run to the names of everything it creates.

Compatibility promise: for a given (dag_id, run_id) the run_key, the resource names and the labels
below never change between Interlude versions. A retry, a clear, a re-run of a backfill and a
triggerer restart all find what earlier tries created (machines to adopt, checkpoints to resume)
only because they compute the same names. Changing this module orphans existing checkpoints, so any
change must keep every existing output identical (tests pin known values).

Google's rules the names obey (Compute Engine instance names, TPU node ids, queued resource ids,
label keys and values): lower case letters, digits and '-', starting with a letter, ending with a
letter or digit, at most 63 characters; label values may be empty and may contain '_'.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any

RUN_KEY_MAX = 40
"""Leaves room for a role suffix (<= 22 chars) in a 63-character resource name."""

NAME_MAX = 63
_HASH_LEN = 10  # 50 bits of sha256: collisions are vanishingly rare within one project's runs
_READABLE_MAX = RUN_KEY_MAX - _HASH_LEN - 1
_ROLE_RE = re.compile(r"^[a-z]([a-z0-9-]{0,20}[a-z0-9])?$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")


def _slug(text: str) -> str:
    """Lower-case ASCII letters and digits, every other run of characters folded into one '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _digest(dag_id: str, run_id: str) -> str:
    raw = hashlib.sha256(f"{dag_id}\x00{run_id}".encode()).digest()
    return base64.b32encode(raw).decode("ascii").lower()[:_HASH_LEN]


def run_key(dag_id: str, run_id: str) -> str:
    """A short, readable, GCP-valid key for one DAG run.

    The readable part (dag id, then run id) is only for people; the hash of the exact
    (dag_id, run_id) pair is what keeps two runs apart when their readable parts coincide
    (backfill ids differing only in ':' or '+', long ids truncated alike).
    """
    if not dag_id or not run_id:
        raise ValueError("run_key needs a non-empty dag_id and run_id")
    readable = _slug(f"{dag_id}-{run_id}")[:_READABLE_MAX].strip("-")
    if not readable or not readable[0].isalpha():
        readable = ("r-" + readable)[:_READABLE_MAX].strip("-")
    return f"{readable}-{_digest(dag_id, run_id)}"


def resource_name(key: str, role: str) -> str:
    """The name of one resource of a run (node, VM, queued resource): `<run_key>-<role>`."""
    if not _ROLE_RE.match(role):
        raise ValueError(f"role {role!r} must be 1-22 chars of [a-z0-9-], starting with a letter")
    name = f"{key}-{role}"
    if not NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a valid Google resource name")
    return name


def label_value(text: str) -> str:
    """Fold free text (a dag id, a stage) into a valid label value, truncated to 63 characters."""
    return re.sub(r"[^a-z0-9_-]+", "-", text.lower())[:NAME_MAX]


def labels(key: str, dag_id: str, stage: str | None = None) -> dict[str, str]:
    """Labels put on every resource a run creates, so a list call finds them all (teardown, audits)."""
    out = {"managed-by": "interlude", "interlude-run": key, "interlude-dag": label_value(dag_id)}
    if stage:
        out["interlude-stage"] = label_value(stage)
    return out


def checkpoint_prefix(key: str, stage: str | None = None) -> str:
    """The object prefix (inside the bucket) that holds a run's checkpoints, events and report."""
    from interlude_workload import layout

    return str(layout.stage_prefix(key, stage) if stage else layout.run_prefix(key))


RUN_ID_METADATA = "interlude-run-id"
DAG_ID_METADATA = "interlude-dag-id"
"""Metadata keys naming the Airflow run that owns a machine (run ids do not fit in a label value): the
sweeper asks Airflow for that run's state. The label `interlude-run` (the run key) must match them."""


def queued_resource_id(machine: Mapping[str, Any]) -> str:
    """The queued resource that asks for a machine: named from the machine (so a retry finds it)."""
    return f"{machine['name']}-qr"
