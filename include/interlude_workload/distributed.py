"""The trainer over N worker processes: who this worker is, JAX's distributed runtime, and the workers' agreement.

A multi-host TPU slice runs the same program on every worker VM; JAX joins them with ``jax.distributed.initialize``
(https://docs.jax.dev/en/latest/multi_process.html) and the training step runs data-parallel over every device of
every worker (a mesh with one ``data`` axis: each worker computes its rows of the global batch, the gradients are
all-reduced by XLA, the replicated weights and AdamW state stay equal on every worker). On CPU the cross-process
collectives are gloo's over TCP (``jax_cpu_collectives_implementation``, gloo by default in jax 0.10); on a TPU
slice they are the ICI/DCN ones. One worker (the default) never touches ``jax.distributed``: the trainer is then
exactly the single-process program.

Who this worker is, first match wins (:func:`resolve`):

* the flags ``--num-workers`` / ``--worker-id`` / ``--coordinator host:port``;
* ``INTERLUDE_NUM_WORKERS`` / ``INTERLUDE_WORKER_ID`` / ``INTERLUDE_COORDINATOR`` (what the local cloud sets for
  each worker's processes);
* a Cloud TPU VM's metadata, as JAX's own cluster detection reads it (jax/_src/clusters/cloud_tpu_cluster.py):
  ``instance/attributes/agent-worker-number`` and ``instance/attributes/worker-network-endpoints`` (comma-separated,
  each entry a hostname or ``name:id:ip``; worker 0's address is the coordinator, on JAX's TPU port 8482);
* otherwise one worker.

Decisions that must be the same on every worker (commit this step, hold, stop) are taken in *agreement rounds*:
each worker contributes its local reasons as bits and every worker gets the OR of all of them
(``multihost_utils.process_allgather``, a collective: every worker calls it the same number of times, once per step
and once per hold tick). One worker's maintenance notice, SIGTERM or control request is thereby every worker's
checkpoint of the same step.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

NUM_WORKERS_ENV = "INTERLUDE_NUM_WORKERS"
WORKER_ID_ENV = "INTERLUDE_WORKER_ID"
COORDINATOR_ENV = "INTERLUDE_COORDINATOR"
TPU_COORDINATOR_PORT = 8482  # JAX's for Cloud TPU slices (jax/_src/clusters/cloud_tpu_cluster.py)
WORKER_NUMBER_KEY = "instance/attributes/agent-worker-number"
ENDPOINTS_KEY = "instance/attributes/worker-network-endpoints"
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class Workers:
    """This process's place among the stage's worker processes."""

    count: int = 1
    index: int = 0
    coordinator: str | None = None

    @property
    def multi(self) -> bool:
        return self.count > 1

    @property
    def primary(self) -> bool:
        """Worker 0: the one that writes the stage's shared files (progress, retention, export, control answers),
        as Orbax's primary host (``MultiprocessingOptions.primary_host=0``) writes a step's metadata and marker."""
        return self.index == 0

    def describe(self) -> str:
        return f"worker {self.index} of {self.count} (coordinator {self.coordinator})" if self.multi else "1 worker"


def resolve(
    num_workers: int | None = None,
    worker_id: int | None = None,
    coordinator: str | None = None,
    metadata_url: str | None = None,
) -> Workers:
    """Who this worker is (see the module doc for the order); ValueError naming what does not fit."""
    env = os.environ
    count = num_workers if num_workers is not None else _int_env(NUM_WORKERS_ENV)
    index = worker_id if worker_id is not None else _int_env(WORKER_ID_ENV)
    coordinator = coordinator or env.get(COORDINATOR_ENV) or None
    if count is None and index is None and metadata_url and _may_be_google(metadata_url):
        found = from_metadata(metadata_url)
        if found is not None:
            count, index, coordinator = found.count, found.index, coordinator or found.coordinator
    count = 1 if count is None else count
    index = 0 if index is None else index
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"worker id {index} does not fit {count} worker(s)")
    if count > 1 and not coordinator:
        raise ValueError(f"{count} workers need a coordinator host:port (--coordinator or ${COORDINATOR_ENV})")
    if coordinator and ":" not in coordinator:
        raise ValueError(f"coordinator {coordinator!r} is not host:port")
    return Workers(count, index, coordinator if count > 1 else None)


def _may_be_google(metadata_url: str) -> bool:
    """Whether asking ``metadata_url`` can tell anything: a metadata server named explicitly (a local cloud's), or
    Google's on a machine that is a Compute Engine VM (its DMI product name, as Google documents:
    https://cloud.google.com/compute/docs/instances/detect-compute-engine). Elsewhere (a laptop) the lookup of
    metadata.google.internal would only delay a one-worker start."""
    from interlude_workload.maintenance import DEFAULT_METADATA_URL

    if metadata_url.rstrip("/") != DEFAULT_METADATA_URL:
        return True
    try:
        with open("/sys/class/dmi/id/product_name", encoding="utf-8") as handle:
            return "Google" in handle.read()
    except OSError:
        return False


def _int_env(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name}={value!r} is not a whole number") from None


def from_metadata(metadata_url: str, timeout: float = 2.0) -> Workers | None:
    """The TPU VM's worker number and its slice's endpoints from the metadata server; None off a TPU VM (no
    ``agent-worker-number``: a 404, or no metadata server at all)."""
    number = _metadata(metadata_url, WORKER_NUMBER_KEY, timeout)
    if number is None:
        return None
    endpoints = _metadata(metadata_url, ENDPOINTS_KEY, timeout) or ""
    hosts = [_endpoint_host(entry) for entry in endpoints.split(",") if entry.strip()]
    if len(hosts) <= 1:
        return Workers()
    return Workers(len(hosts), int(number), f"{hosts[0]}:{TPU_COORDINATOR_PORT}")


def _endpoint_host(entry: str) -> str:
    """A hostname, or the ip of an old-style ``name:id:ip`` triple (as JAX's cloud_tpu_cluster reads them)."""
    parts = entry.strip().split(":")
    if len(parts) == 1:
        return parts[0]
    if len(parts) == 3:
        return parts[2]
    raise ValueError(f"unsupported worker-network-endpoints entry {entry!r}")


def _metadata(base: str, key: str, timeout: float) -> str | None:
    request = urllib.request.Request(f"{base.rstrip('/')}/{key}", headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return str(response.read().decode()).strip()
    except (urllib.error.URLError, OSError, ValueError):
        return None


def initialize(workers: Workers, timeout_seconds: int = 300) -> None:
    """``jax.distributed.initialize`` for ``workers`` (call before JAX's first computation; a no-op for one).

    Locally (a loopback coordinator) the coordinator binds to that address only, not JAX's default ``[::]``:
    local services listen on 127.0.0.1 only. gloo is named explicitly for CPU collectives (jax 0.10's default)."""
    if not workers.multi:
        return
    import jax

    assert workers.coordinator is not None
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    host = workers.coordinator.rsplit(":", 1)[0]
    jax.distributed.initialize(
        coordinator_address=workers.coordinator,
        num_processes=workers.count,
        process_id=workers.index,
        coordinator_bind_address=workers.coordinator if host in LOOPBACK else None,
        initialization_timeout=timeout_seconds,
    )


class Mesh:
    """The global data-parallel mesh over every device of every worker: ``data`` x ``replica``.

    The batch's rows are split over ``data``, as many ways as both the batch and the device count allow (their
    greatest common divisor); the devices along ``replica`` compute the same rows. One device per worker (CPU, a
    GPU each) with a batch they divide is plain data parallelism; a TPU slice with more chips than rows (a
    v5litepod-16's 16 chips, the small model's 8 rows) still runs, two chips to a row group."""

    def __init__(self, batch_size: int, devices: list[Any] | None = None) -> None:
        import math

        import jax
        import numpy as np
        from jax.sharding import Mesh as JaxMesh
        from jax.sharding import NamedSharding, PartitionSpec

        devices = jax.devices() if devices is None else devices  # a subset: a test's layouts of a few workers
        self.devices = len(devices)
        self.data = math.gcd(batch_size, self.devices)
        grid = np.asarray(devices, dtype=object).reshape(self.data, self.devices // self.data)
        self.mesh = JaxMesh(grid, ("data", "replica"))
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.rows = NamedSharding(self.mesh, PartitionSpec("data"))

    def describe(self) -> str:
        return f"{self.devices} devices, the batch's rows split {self.data} ways"

    def put(self, tree: Any) -> Any:
        """A tree every worker computed alike (fresh state, the token stream), as replicated global arrays."""
        import jax
        import numpy as np

        return jax.device_put(jax.tree_util.tree_map(np.asarray, tree), self.replicated)

    def abstract(self, tree: Any) -> Any:
        """A restore target for Orbax: the same shapes and dtypes, replicated over the mesh."""
        import jax

        return jax.tree_util.tree_map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=self.replicated), tree
        )


def local(tree: Any) -> Any:
    """This worker's copy of replicated global arrays, as host arrays (digest, export)."""
    import jax
    import numpy as np

    def one(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return np.asarray(leaf.addressable_data(0))
        return np.asarray(leaf)

    return jax.tree_util.tree_map(one, tree)


def gather(value: int) -> list[int]:
    """Every worker's ``value``, in worker order (a collective: every worker must call it)."""
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.asarray([value], dtype=np.int64))
    return [int(v) for v in np.asarray(gathered).reshape(-1)]


def agree(flags: int) -> int:
    """The OR of every worker's ``flags`` (an agreement round; see the module doc)."""
    result = 0
    for value in gather(flags):
        result |= value
    return result
