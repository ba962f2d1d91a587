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

Against real Google (``STORAGE_EMULATOR_HOST`` unset) none of those is changed: the clients' defaults are Google's.
One setting applies everywhere, Google included (:data:`EVERYWHERE`):

- ``FSSPEC_GCS_USE_LISTINGS_CACHE=false``: gcsfs remembers a directory's listing and then answers ``exists`` of a
  path under it from that listing. Orbax writes a step's items concurrently; when something lists the step's
  directory before an item's first object lands, the item's later ``exists`` check says "Checkpoint directory does
  not exist" and the save fails (seen under load: a plain Orbax job lost steps 16-20; reproduced: list ``20/``
  holding ``meta`` only, write ``20/state/y``, ``epath.Path('gs://.../20/state').exists()`` is False with the cache,
  True without). This is gcsfs's behaviour against real GCS as much as against an emulator.
"""

from __future__ import annotations

import os

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
CLOSED_LOOPBACK = "127.0.0.1:1"  # port 1 (tcpmux): nothing listens, a connect is refused at once


EVERYWHERE = {"FSSPEC_GCS_USE_LISTINGS_CACHE": "false"}  # see above: a stale listing fails an Orbax save


def configure_everywhere() -> dict[str, str]:
    """Apply :data:`EVERYWHERE` (a value already set is the operator's choice and is kept), also to fsspec's
    config when fsspec was imported before (it reads ``FSSPEC_*`` once, on import)."""
    import sys

    applied = {name: os.environ.setdefault(name, value) for name, value in EVERYWHERE.items()}
    fsspec_config = sys.modules.get("fsspec.config")
    if fsspec_config is not None:
        fsspec_config.conf.setdefault("gcs", {}).setdefault(
            "use_listings_cache", applied["FSSPEC_GCS_USE_LISTINGS_CACHE"].lower() not in ("false", "0")
        )
    return applied


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
    """Set (in ``os.environ``) and return the variables above when ``STORAGE_EMULATOR_HOST`` is set; {} otherwise
    (:data:`EVERYWHERE` is applied either way).

    Call it before the process's first ``gs://`` operation, best before importing orbax: gcsfs picks its
    file-system class from ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`` when it is imported, fsspec passes the token when
    a file system is made (etils.epath keeps one per process). The values are derived from
    ``STORAGE_EMULATOR_HOST`` on each call and overwrite earlier ones, so a later call follows a moved endpoint (a
    test's proxy); gcsfs itself reads ``STORAGE_EMULATOR_HOST`` on every request.
    """
    configure_everywhere()
    endpoint = emulator_endpoint()
    if endpoint is None:
        return {}
    wanted = environment_for(endpoint)
    os.environ.update(wanted)
    return wanted
