"""Which rows of the global batch each device of a data-parallel slice trains on, over layouts of 1-16 devices.

A worker on the wrong rows (every worker on worker 0's rows, an off-by-one shard) still trains, and its weights stay
within a few 1e-4 of one process's (tests/faults/test_multihost_slice.py measures that, minutes per run); here the
rows themselves are held, in seconds: :func:`interlude_workload.llm.train_step.sharded_batch` on a mesh of N devices
(:class:`interlude_workload.distributed.Mesh`; JAX's CPU backend split into 16 devices in a child process) against
the one-device batch of the same step. For each N and each model size's batch:

* the devices of one slot of the mesh's ``data`` axis hold the same rows, the slots' rows are disjoint and their
  union is the whole batch (each row trained once per step);
* every device holds exactly the one-device batch's rows at the indices it was given (the content, not only the
  layout);
* when the batch divides among the workers (every worker with the same number of devices, in JAX's device order),
  each worker's rows are its own: disjoint from every other worker's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEVICES = 16  # a v5litepod-16's chips
# 1, 2, 4, 8 workers of one device each (rows 1:1, 2:1, ...), 3 and 6 (the batch not divisible: every device
# computes every row, or pairs of devices share slots), 16 (more devices than rows: replicas); each layout compiles
# the batch once, so not every count up to 16
COUNTS = (1, 2, 3, 4, 6, 8, 16)


def test_every_device_trains_its_own_rows_of_the_one_device_batch() -> None:
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}", "JAX_PLATFORMS": "cpu"}
    child = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())], env=env, capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stdout[-3000:] + child.stderr[-3000:]
    checked = [line for line in child.stdout.splitlines() if line.startswith("layout ")]
    assert len(checked) == 2 * len(COUNTS), child.stdout  # both batch sizes, every device count


def _check_every_layout() -> None:
    import jax
    import numpy as np

    from interlude_workload import model
    from interlude_workload.distributed import Mesh
    from interlude_workload.llm import train_step as ts

    assert len(jax.devices()) == DEVICES, jax.devices()
    tokens = np.random.default_rng(0).integers(3, 250, 3000).astype(np.int32)  # any stream longer than a window
    sharded = jax.jit(ts.sharded_batch, static_argnames=("hparams", "rows"))
    for size in ("tiny", "small"):
        hparams = ts.size(size).hparams
        state = model.new_state("train", seed=3, size=size)
        # a step whose windows all start apart, so two different rows are never equal by chance
        state["step"] = np.int32(5)
        one_inputs, one_targets = (np.asarray(a) for a in ts.batch_for(state, model.prepare(tokens), hparams))
        assert len({row.tobytes() for row in one_inputs}) == hparams.batch_size
        for count in COUNTS:
            devices = jax.devices()[:count]
            mesh = Mesh(hparams.batch_size, devices)
            put = mesh.put(state), mesh.put(model.prepare(tokens))
            inputs, targets = sharded(*put, hparams, mesh.rows)
            slots = _rows_by_device(inputs, one_inputs, hparams.batch_size)
            assert slots == _rows_by_device(targets, one_targets, hparams.batch_size)
            _check_slots(slots, mesh, count, hparams.batch_size)
            print(f"layout {size} {count} devices: {mesh.describe()}", flush=True)


def _rows_by_device(sharded: object, one: object, batch: int) -> dict[int, frozenset[int]]:
    """Each device's row indices, after checking it holds the one-device batch's rows there."""
    import numpy as np

    found: dict[int, frozenset[int]] = {}
    for shard in sharded.addressable_shards:  # type: ignore[attr-defined]
        rows = range(batch)[shard.index[0]]
        held, expected = np.asarray(shard.data), np.asarray(one)[shard.index[0]]
        assert held.shape == expected.shape and np.array_equal(held, expected), (
            f"device {shard.device.id} was given rows {list(rows)} but holds other rows"
        )
        found[shard.device.id] = frozenset(rows)
    return found


def _check_slots(slots: dict[int, frozenset[int]], mesh: object, count: int, batch: int) -> None:
    import math

    grid = mesh.mesh.devices  # type: ignore[attr-defined]
    assert sorted(slots) == sorted(device.id for device in grid.flat)
    per_slot = [{slots[device.id] for device in replicas} for replicas in grid]
    assert all(len(rows) == 1 for rows in per_slot), f"{count} devices: replicas of one slot differ: {per_slot}"
    rows = [next(iter(slot)) for slot in per_slot]
    assert sum(len(r) for r in rows) == batch and frozenset().union(*rows) == frozenset(range(batch)), (
        f"{count} devices: the slots' rows {rows} are not a partition of the {batch} rows"
    )
    for workers in range(1, count + 1):
        if count % workers or batch % workers or math.gcd(batch, count) % workers:
            continue  # uneven workers, or a batch the workers cannot split (they then all compute every row)
        per_worker = count // workers
        owned = [
            frozenset().union(*(slots[d.id] for d in grid.flat if d.id // per_worker == w)) for w in range(workers)
        ]
        assert sum(len(o) for o in owned) == batch, f"{workers} workers of {count} devices share rows: {owned}"


if __name__ == "__main__":
    _check_every_layout()
    sys.exit(0)
