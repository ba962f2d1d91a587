"""Orbax checkpoints in the local GCS: a real ``orbax.checkpoint.CheckpointManager`` (OCDBT on, the default) saves
a training state to ``gs://`` on the emulator and a new process restores it bit for bit.

What it exercises is what Orbax does on Google: tensorstore's ``gcs`` kvstore writes the arrays through OCDBT,
whose manifest is updated by a compare-and-swap chain (a download's ``x-goog-generation``, re-reads with
``ifGenerationNotMatch`` -> 304, writes with ``ifGenerationMatch``), and etils.epath/gcsfs writes the metadata,
the ``commit_success.txt`` step markers and deletes pruned steps (``max_to_keep``).

Saver and restorer are each a new process running this file (``python test_gcs_orbax.py save|restore ROOT``):
both import jax/orbax (~3-5 s each), which the pytest worker then need not (no XLA threads in a worker that
other tests fork from, no process-wide gcsfs/google-auth settings left behind). Each prints one JSON line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx

from interlude_workload.testing import GcsEmulator

STEPS = (1, 2, 3)
KEEP = 2


def _noise(key: Any, tree: Any) -> Any:
    import jax

    return jax.tree.map(lambda p: jax.random.normal(key, p.shape, p.dtype), tree)


def _state(step: int) -> Any:
    """{params, optax adamw state, PRNG key, step} after ``step`` deterministic AdamW updates (so each saved
    step differs from the last, moments included)."""
    import jax
    import jax.numpy as jnp
    import optax

    params = {
        "emb": jnp.arange(256 * 32, dtype=jnp.float32).reshape(256, 32) / 1000.0,
        "w": jnp.ones((32, 32), jnp.bfloat16),
        "b": jnp.linspace(-1.0, 1.0, 32, dtype=jnp.float32),
    }
    opt = optax.adamw(3e-3, weight_decay=0.1)
    opt_state = opt.init(params)
    key = jax.random.PRNGKey(42)
    for _ in range(step):
        key, sub = jax.random.split(key)
        grads = _noise(sub, params)
        updates, opt_state = opt.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return {"params": params, "opt_state": opt_state, "key": key, "step": step}


def _digests(state: Any) -> dict[str, str]:
    """sha256 of each leaf's dtype, shape and bytes, by its tree path."""
    import hashlib

    import jax
    import numpy as np

    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        arr = np.asarray(leaf)
        out[jax.tree_util.keystr(path)] = hashlib.sha256(f"{arr.dtype}{arr.shape}".encode() + arr.tobytes()).hexdigest()
    return out


def _manager(root: str, **options: Any) -> Any:
    import orbax.checkpoint as ocp

    return ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(**options))


def save(root: str) -> dict[str, Any]:
    """Steps 1 and 2 as the interval allows, step 3 only because forced; timed per step (save + commit)."""
    import time

    import orbax.checkpoint as ocp

    mngr = _manager(root, max_to_keep=KEEP, save_interval_steps=2)
    seconds, skipped = {}, []
    for step in STEPS:
        state = _state(step)
        if not mngr.should_save(step):
            skipped.append(step)
            assert not mngr.save(step, args=ocp.args.StandardSave(state))
        start = time.perf_counter()
        assert mngr.save(step, args=ocp.args.StandardSave(state), force=step in skipped)
        mngr.wait_until_finished()
        seconds[step] = round(time.perf_counter() - start, 3)
    mngr.close()
    return {"digests": _digests(state), "seconds": seconds, "skipped": skipped, "steps": list(mngr.all_steps())}


def restore(root: str) -> dict[str, Any]:
    """The latest step, restored into the structure (and dtypes) of the state the trainer would build."""
    import time

    import jax
    import orbax.checkpoint as ocp

    mngr = _manager(root, max_to_keep=KEEP)
    latest = mngr.latest_step()
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, _state(0))
    start = time.perf_counter()
    state = mngr.restore(latest, args=ocp.args.StandardRestore(target))
    seconds = round(time.perf_counter() - start, 3)
    return {"latest": latest, "steps": list(mngr.all_steps()), "digests": _digests(state), "seconds": seconds}


def _run(mode: str, root: str) -> dict[str, Any]:
    """This file as a new process (the environment carries STORAGE_EMULATOR_HOST); its one JSON line."""
    proc = subprocess.run([sys.executable, __file__, mode, root], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{mode} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _names(emulator: GcsEmulator, bucket: str, prefix: str) -> list[str]:
    names, token = [], None
    while True:
        query = {"prefix": prefix, "fields": "items(name),nextPageToken", **({"pageToken": token} if token else {})}
        page = httpx.get(f"{emulator.endpoint}/storage/v1/b/{bucket}/o", params=query).json()
        names += [item["name"] for item in page.get("items", [])]
        token = page.get("nextPageToken")
        if not token:
            return names


def test_orbax_saves_prunes_and_a_new_process_restores_bit_for_bit(gcs_emulator: GcsEmulator, bucket: str) -> None:
    root = f"gs://{bucket}/ckpt"
    saved = _run("save", root)
    assert saved["skipped"] == [3]  # saved only because forced
    assert saved["steps"] == [2, 3]

    names = _names(gcs_emulator, bucket, "ckpt/")
    assert {name.split("/")[1] for name in names} == {"2", "3"}  # step 1 pruned, every object of it
    for step in (2, 3):
        assert f"ckpt/{step}/commit_success.txt" in names
        assert any(name.startswith(f"ckpt/{step}/default/ocdbt.process_0/d/") for name in names)  # OCDBT on

    restored = _run("restore", root)
    assert restored["latest"] == 3 and restored["steps"] == [2, 3]
    assert len(saved["digests"]) > 8  # params, both adamw moments, count, key, step
    assert restored["digests"] == saved["digests"]
    print(f"\nsave seconds per step {saved['seconds']}, restore seconds {restored['seconds']}")


if __name__ == "__main__":
    from interlude_workload.orbax_env import configure_for_emulator

    configure_for_emulator()  # before orbax (gcsfs, google-auth) is imported
    mode, root = sys.argv[1], sys.argv[2]
    print(json.dumps(save(root) if mode == "save" else restore(root)))
