"""Imports the machine's agent (and the trainers it forks) go without: time on every boot, before training again.

The agent is started on every boot of the machine, and everything it imports is imported again after each
maintenance, before the trainer steps again (the restore: benchmarks/README.md). google-cloud-core and
google-api-core import gRPC (``grpc``, ``grpc_status``: ~20 ms of CPU on a quiet 2-core machine, 40-50 ms of
wall time under load) only to build gRPC channels and to map gRPC status codes; the workload talks to GCS
over the JSON API and never uses them. Both libraries import it inside ``try: ... except ImportError``, so a
missing gRPC is a configuration they support: a ``None`` in ``sys.modules`` makes ``import grpc`` raise
ImportError (https://docs.python.org/3/reference/import.html#the-module-cache).
"""

from __future__ import annotations

import sys

OPTIONAL = ("grpc",)


def skip_optional_imports() -> None:
    """Call before anything imports google.cloud.storage; a module already imported stays as it is."""
    for name in OPTIONAL:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
