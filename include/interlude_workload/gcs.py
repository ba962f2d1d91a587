"""One way to get a Google Cloud Storage client, for the machine and for Airflow alike.

Why a factory: the same code talks to real GCS (application default credentials on a VM, a service
account on a worker) and to a local emulator (``STORAGE_EMULATOR_HOST``), which accepts no credentials
at all. ``google-cloud-storage`` already routes to the emulator when the variable is set, but it would
still try to find real credentials first; giving it anonymous credentials and a project keeps a
credential-less machine (a test, the local cloud) from failing or, worse, picking up someone's real
credentials.
"""

from __future__ import annotations

import os

from google.cloud import storage

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
DEFAULT_EMULATOR_PROJECT = "local-project"
# google-cloud-storage (3.x) starts a thread per new Client and bucket that GETs the bucket's metadata, to tag
# OpenTelemetry trace spans with it; the workload exports no traces, and the thread is one more GCS call in the
# restore path and a thread that makes the agent unsafe to fork (see interlude_workload.warm).
BUCKET_METADATA_OFF_ENV = "DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA"
OTEL_TRACES_ENV = "ENABLE_GCS_PYTHON_CLIENT_OTEL_TRACES"


def skip_bucket_metadata_lookups() -> None:
    """For the workload's own processes (agent, trainer): no background bucket lookups unless traces are on.
    An explicit setting of either variable wins."""
    if os.environ.get(OTEL_TRACES_ENV, "").strip().lower() not in {"1", "true", "yes", "on"}:
        os.environ.setdefault(BUCKET_METADATA_OFF_ENV, "true")


def storage_client(project: str | None = None, emulator: str | None = None) -> storage.Client:
    """Return a storage client: anonymous against the emulator when one is configured, real otherwise.

    ``emulator`` names the emulator's endpoint explicitly (tools that talk to a local cloud without
    changing the process environment); otherwise ``STORAGE_EMULATOR_HOST`` decides.
    """
    emulator = emulator or os.environ.get(EMULATOR_ENV)
    if emulator:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(
            project=project or os.environ.get("GOOGLE_CLOUD_PROJECT") or DEFAULT_EMULATOR_PROJECT,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": emulator},
        )
    return storage.Client(project=project)
