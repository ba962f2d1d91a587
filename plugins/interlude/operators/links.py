"""Extra links on the stage operators: the machine in the Cloud Console, and the checkpoint folder.

Airflow 3 computes a link on the worker when the task finishes and stores it in XCom, so the
API server never needs to import this module; the links read only the rendered operator fields.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseOperatorLink

CONSOLE = "https://console.cloud.google.com"


class MachineConsoleLink(BaseOperatorLink):
    name = "Machine (Cloud Console)"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        machine = getattr(operator, "machine", None)
        if not isinstance(machine, dict):
            return ""
        zone, name = machine["zone"], machine["name"]
        if machine.get("kind") == "gce_vm":
            return f"{CONSOLE}/compute/instancesDetail/zones/{zone}/instances/{name}"
        return f"{CONSOLE}/compute/tpus/details/{zone}/{name}"


class CheckpointsLink(BaseOperatorLink):
    name = "Checkpoints (Cloud Storage)"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from interlude import naming
        from interlude.spec import RunSpec

        raw = getattr(operator, "spec", None)
        if not isinstance(raw, dict):
            return ""
        spec = RunSpec.from_dict(raw)
        return f"{CONSOLE}/storage/browser/{spec.bucket}/{naming.checkpoint_prefix(spec.run_key, operator.stage)}"
