"""gcsfs's listing cache must not answer Orbax's ``exists`` checks (orbax_env.EVERYWHERE).

Why: Orbax writes a step's items concurrently and checks an item's directory exists before it writes the item's
metadata. gcsfs answers ``exists`` from a listing it remembers: if the step's directory was listed before the item's
first object landed, the check fails and so does the save ("Checkpoint directory does not exist"; a plain Orbax job
drilled under the full suite's load lost five steps to it). The sequence is replayed here in a new process, as a
trainer or a user's job starts, against the GCS emulator: list ``20/`` while only ``meta`` is there, write
``20/state``, ask whether ``20/state`` exists.
"""

from __future__ import annotations

import os
import subprocess
import sys

from interlude_workload.job import job_environment
from interlude_workload.orbax_env import EVERYWHERE
from interlude_workload.testing import GcsEmulator

REPLAY = """
import sys
from interlude_workload import orbax_env
if sys.argv[2] == "configured":
    orbax_env.configure_for_emulator()  # what the trainer does before importing Orbax (orbax_io)
from etils import epath
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

bucket = storage.Client(project="p", credentials=AnonymousCredentials()).bucket(sys.argv[1])
bucket.blob("ck/20/meta/x").upload_from_string("1")
listed = [p.name for p in epath.Path(f"gs://{sys.argv[1]}/ck/20").iterdir()]
bucket.blob("ck/20/state/y").upload_from_string("2")
print(listed, epath.Path(f"gs://{sys.argv[1]}/ck/20/state").exists())
"""


def _replay(gcs_emulator: GcsEmulator, bucket: str, mode: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in EVERYWHERE}
    env["STORAGE_EMULATOR_HOST"] = gcs_emulator.endpoint
    out = subprocess.run(
        [sys.executable, "-c", REPLAY, bucket, mode], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.strip().splitlines()[-1]


def test_a_directory_listed_before_its_item_was_written_still_shows_the_item(
    gcs_emulator: GcsEmulator, bucket: str
) -> None:
    assert _replay(gcs_emulator, bucket, "configured") == "['meta'] True"


def test_gcsfs_left_to_its_default_says_the_item_is_absent(gcs_emulator: GcsEmulator, bucket: str) -> None:
    """The hazard itself, so the test above would notice gcsfs changing under it (and this one, gcsfs fixing it)."""
    assert _replay(gcs_emulator, bucket, "default") == "['meta'] False"


def test_a_users_job_gets_the_setting_and_can_override_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert job_environment({})["FSSPEC_GCS_USE_LISTINGS_CACHE"] == "false"
    monkeypatch.setenv("FSSPEC_GCS_USE_LISTINGS_CACHE", "true")
    assert job_environment({})["FSSPEC_GCS_USE_LISTINGS_CACHE"] == "true"
