"""Point Orbax (tensorstore for arrays, etils.epath -> gcsfs for everything else) at the local GCS.

Orbax reaches ``gs://`` through three clients, and ``STORAGE_EMULATOR_HOST`` (what google-cloud-storage and
gcsfs read) reaches only some of them; measured in docs/orbax-local-gcs.md (team notes), Orbax 0.12.8,
tensorstore 0.1.86, gcsfs 2026.10.1:

- ``TENSORSTORE_GCS_HTTP_URL``: tensorstore's ``gcs`` kvstore (every array byte, the OCDBT manifests) ignores
  ``STORAGE_EMULATOR_HOST`` and goes to storage.googleapis.com unless this names the endpoint.
- ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: gcsfs 2026.10 otherwise asks the Storage Control API (which the
  emulator does not serve) for the bucket's layout on every path operation, fails after a credential search and
  does not remember the failure: 9-13 s per ``epath.Path('gs://...').exists()``.
- ``FSSPEC_GCS_TOKEN=anon``: fsspec hands ``token="anon"`` to every GCSFileSystem, so gcsfs does not search for
  credentials (``google.auth.default()``, ~3 s) the emulator would ignore anyway.
- ``GCE_METADATA_HOST`` / ``GCE_METADATA_IP`` / ``GCE_METADATA_ROOT`` = a closed loopback port: the credential
  searches that remain (tensorstore's, google-auth's GCE probe) ask "the metadata server", by default
  metadata.google.internal / 169.254.169.254; pinned here they are refused at once, on this machine, and never
  reach a real metadata server (which would hand out a real identity) or wait out a DNS/connect timeout. The
  workload's own metadata reader uses ``INTERLUDE_METADATA_URL``, untouched. google-auth reads
  ``GCE_METADATA_HOST`` when it is first imported, so call this before importing orbax (the IP is read per probe).

Against real Google (``STORAGE_EMULATOR_HOST`` unset) nothing is changed: the clients' defaults are Google's.
"""

from __future__ import annotations

import os

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
CLOSED_LOOPBACK = "127.0.0.1:1"  # port 1 (tcpmux): nothing listens, a connect is refused at once


def emulator_endpoint() -> str | None:
    """The emulator's URL, scheme included (google-cloud-storage accepts ``host:port`` and adds ``http://``)."""
    host = os.environ.get(EMULATOR_ENV, "").strip().rstrip("/")
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def environment_for(endpoint: str) -> dict[str, str]:
    """The variables that send tensorstore and gcsfs to ``endpoint`` and keep their credential searches local."""
    return {
        "TENSORSTORE_GCS_HTTP_URL": endpoint,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "FSSPEC_GCS_TOKEN": "anon",
        "GCE_METADATA_HOST": CLOSED_LOOPBACK,
        "GCE_METADATA_IP": CLOSED_LOOPBACK,
        "GCE_METADATA_ROOT": CLOSED_LOOPBACK,
    }


def configure_for_emulator() -> dict[str, str]:
    """Set (in ``os.environ``) and return the variables above when ``STORAGE_EMULATOR_HOST`` is set; {} otherwise.

    Call it before the process's first ``gs://`` operation, best before importing orbax: gcsfs picks its
    file-system class from ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` when it is imported, fsspec passes the token when
    a file system is made (etils.epath keeps one per process). The values are derived from
    ``STORAGE_EMULATOR_HOST`` on each call and overwrite earlier ones, so a later call follows a moved endpoint (a
    test's proxy); gcsfs itself reads ``STORAGE_EMULATOR_HOST`` on every request.
    """
    endpoint = emulator_endpoint()
    if endpoint is None:
        return {}
    wanted = environment_for(endpoint)
    os.environ.update(wanted)
    return wanted
