"""Extra links on the stage operators: the machine, and the checkpoint folder, where the run ran.

On Google the links open the Cloud Console (with `?project=`, or the console opens whatever project the
user looked at last). On the local cloud they open the local cloud's own read-only pages
(`/_localcloud/pages/...`, include/interlude_localcloud/pages.py): a console link there would point at a project
that does not exist. Which one is decided by the Google connection's endpoint extras (hooks/connection.py):
an endpoint outside googleapis.com is the local cloud.

Airflow 3 computes a link on the worker when the task finishes and stores it in XCom, so the API server
never needs to import this module; the links read only the rendered operator fields and the connection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from airflow.sdk import BaseOperatorLink

from interlude import naming

CONSOLE = "https://console.cloud.google.com"
ENDPOINT_EXTRAS = ("tpu_endpoint", "compute_endpoint")
_LEGACY_PREFIX = "extra__google_cloud_platform__"  # older connections spell their extras this way


@dataclass(frozen=True)
class Target:
    """Where links go: the local cloud at `local_endpoint`, else Google's console for `project`."""

    project: str | None
    local_endpoint: str | None = None


def _extra(extras: Mapping[str, Any], key: str) -> str:
    value = extras.get(key) or extras.get(_LEGACY_PREFIX + key)
    return str(value).rstrip("/") if value else ""


def is_google_endpoint(url: str) -> bool:
    """Google's public or private (PSC `*.p.googleapis.com`) API endpoints live under googleapis.com."""
    host = (urlsplit(url).hostname or "").lower()
    return host == "googleapis.com" or host.endswith(".googleapis.com")


def target_from_extras(extras: Mapping[str, Any]) -> Target:
    """The connection's extras decide: a non-Google endpoint extra means the local cloud serves the run."""
    project = _extra(extras, "project") or None
    for key in ENDPOINT_EXTRAS:
        endpoint = _extra(extras, key)
        if endpoint and not is_google_endpoint(endpoint):
            return Target(project, endpoint)
    return Target(project)


def _q(part: str) -> str:
    return quote(part, safe="")


def _project_query(project: str | None) -> str:
    return f"?project={_q(project)}" if project else ""


def machine_url(machine: Mapping[str, Any], target: Target) -> str:
    """The TPU node / VM page (https://cloud.google.com/tpu/docs/managing-tpus-tpu-vm, Compute Engine's
    instance details), or the local cloud's machine page."""
    zone, name, vm = _q(str(machine["zone"])), _q(str(machine["name"])), machine.get("kind") == "gce_vm"
    if target.local_endpoint:
        return f"{target.local_endpoint}/_localcloud/pages/machines/{'gce' if vm else 'tpu'}/{zone}/{name}"
    if vm:
        return f"{CONSOLE}/compute/instancesDetail/zones/{zone}/instances/{name}{_project_query(target.project)}"
    return f"{CONSOLE}/compute/tpus/details/{zone}/{name}{_project_query(target.project)}"


def checkpoints_url(bucket: str, prefix: str, target: Target) -> str:
    """A folder of the bucket (https://cloud.google.com/storage/docs/cloud-console), or the local cloud's page."""
    path = f"{_q(bucket)}/{quote(prefix, safe='/')}"
    if target.local_endpoint:
        return f"{target.local_endpoint}/_localcloud/pages/gcs/{path}"
    return f"{CONSOLE}/storage/browser/{path}{_project_query(target.project)}"


def operator_target(operator: Any) -> Target:
    """The target of the operator's Google connection (`gcp_conn_id`; None = anonymous, Google)."""
    conn_id = getattr(operator, "gcp_conn_id", None)
    if not conn_id:
        return Target(None)
    from airflow.sdk import BaseHook

    return target_from_extras(BaseHook.get_connection(conn_id).extra_dejson)


class MachineConsoleLink(BaseOperatorLink):
    name = "Machine"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        machine = getattr(operator, "machine", None)
        if not isinstance(machine, dict):
            return ""
        return machine_url(machine, operator_target(operator))


class CheckpointsLink(BaseOperatorLink):
    name = "Checkpoints"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from interlude.training.spec import RunSpec

        raw = getattr(operator, "spec", None)
        if not isinstance(raw, dict):
            return ""
        spec = RunSpec.from_dict(raw)
        prefix = naming.checkpoint_prefix(spec.run_key, str(operator.stage))
        return checkpoints_url(spec.bucket, prefix, operator_target(operator))


def timeline_url(base_url: str, dag_id: str, run_id: str) -> str:
    """The run's page in the Interlude view (interlude.ui, mounted by the api-server under /interlude)."""
    from interlude.ui.pages import URL_PREFIX, timeline_href

    return base_url.rstrip("/") + timeline_href(URL_PREFIX, dag_id, run_id)


class TimelineLink(BaseOperatorLink):
    """The run's timeline (stages, checkpoints, maintenance, recomputed steps; serving pods) in the Airflow UI's
    Interlude view, at the api-server's `[api] base_url`."""

    name = "Timeline"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.configuration import conf

        return timeline_url(conf.get("api", "base_url", fallback="") or "", ti_key.dag_id, ti_key.run_id)
