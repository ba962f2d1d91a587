"""Checks against the cloud that bad input must pass before anything is created.

`RunSpec` checks shapes without the network; these ask the cloud the questions only it can answer:
does each zone exist for this project, does the bucket exist and can the run write to it. Each
problem names the param, so the first task of a run fails with a message the user can act on.
"""

from __future__ import annotations

import logging
from typing import Any

from interlude.training.spec import RunSpec, RunSpecError

log = logging.getLogger(__name__)


def zone_problems(spec: RunSpec, compute: Any) -> list[str]:
    """`zones.get` for each zone: an unknown zone would otherwise surface as a 404 deep inside teardown."""
    return [f"zones: {zone!r} does not exist for this project" for zone in spec.zones if compute.get_zone(zone) is None]


def bucket_problems(spec: RunSpec, client: Any) -> list[str]:
    """Write (then remove) one small object under the run's own prefix: proves the bucket exists and is writable."""
    from google.api_core import exceptions as gexc

    from interlude_workload import layout

    name = layout.preflight_object(spec.run_key)
    try:
        blob = client.bucket(spec.bucket).blob(name)
        blob.upload_from_string(b"interlude preflight", content_type="text/plain")
        blob.delete()
    except gexc.NotFound:
        return [f"bucket: gs://{spec.bucket} does not exist (create it, or set the bucket param)"]
    except gexc.Forbidden:
        return [f"bucket: gs://{spec.bucket} is not writable by this connection's identity"]
    return []


def check(spec: RunSpec, compute: Any, storage_client: Any) -> None:
    problems = zone_problems(spec, compute) + bucket_problems(spec, storage_client)
    if problems:
        raise RunSpecError(problems)
    log.info("Preflight passed: zones %s exist, gs://%s is writable", ", ".join(spec.zones), spec.bucket)
