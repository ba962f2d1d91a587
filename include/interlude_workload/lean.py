"""Imports the machine's agent (and the trainers it forks) go without: time on every boot, before training again.

The agent is started on every boot of the machine, and everything it imports is imported again after each
maintenance, before the trainer steps again (the restore: benchmarks/README.md). Each module skipped here is
one that google-cloud-storage's stack imports only for a feature the workload does not use, and imports inside
``try: ... except ImportError``, so a missing one is a configuration the library itself supports; a ``None``
in ``sys.modules`` makes ``import NAME`` raise ImportError
(https://docs.python.org/3/reference/import.html#the-module-cache):

- ``chardet`` and ``charset_normalizer``: requests imports whichever is installed to guess the text encoding
  of a response that declares none (``Response.apparent_encoding``, used by ``Response.text``); without one it
  takes UTF-8. GCS's JSON API declares its charset (``application/json; charset=UTF-8``) and is UTF-8 anyway
  (https://cloud.google.com/storage/docs/json_api), and the clients read bodies as bytes or JSON. requests
  warns once at import that neither is there; that warning is silenced here, for this reason.
- ``opentelemetry``: google-cloud-storage imports it to create trace spans and metrics, which it records only
  when ``ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES`` / ``GCP_STORAGE_PYTHON_ENABLE_OTEL_METRICS`` turn them on
  (https://cloud.google.com/python/docs/reference/storage/latest); skipped only when both are off.

Measured (benchmarks/README.md, 2026-12-04): charset detection and OpenTelemetry were ~15 % of the agent's
import time. What is left is needed at import time (protobuf for google-api-core's error details, cryptography
for google-auth's signers, numpy for the model, Orbax and JAX for the checkpoints). gRPC was skipped too until the
checkpoints became Orbax's: Orbax reaches ``gs://`` paths through etils.epath and gcsfs, and gcsfs (2026.10)
imports google-cloud-storage's gRPC client (``google.cloud._storage_v2``) when it is itself imported, so a
``None`` for ``grpc`` made every trainer fail at its first save or restore.
"""

from __future__ import annotations

import os
import sys
import warnings

ALWAYS = ("chardet", "charset_normalizer")
TELEMETRY = ("opentelemetry",)
TELEMETRY_ENV = ("ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES", "GCP_STORAGE_PYTHON_ENABLE_OTEL_METRICS")
_TRUE = {"1", "true", "yes", "on"}


def telemetry_enabled() -> bool:
    """Whether google-cloud-storage is asked to record traces or metrics (then OpenTelemetry is imported)."""
    return any(os.environ.get(name, "").strip().lower() in _TRUE for name in TELEMETRY_ENV)


def optional_imports() -> tuple[str, ...]:
    """The modules :func:`skip_optional_imports` makes unimportable in this process."""
    return ALWAYS if telemetry_enabled() else ALWAYS + TELEMETRY


def skip_optional_imports() -> None:
    """Call before anything imports google.cloud.storage; a module already imported stays as it is."""
    for name in optional_imports():
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
    # requests' RequestsDependencyWarning at its import (see the module docstring: UTF-8 is what GCS sends).
    warnings.filterwarnings("ignore", message="Unable to find acceptable character detection", module="requests")
