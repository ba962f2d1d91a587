"""Retention of older checkpoints off the training loop: one background thread per Checkpointer.

Why: after each commit the SDK deletes the checkpoints beyond the last ``keep`` (a listing, a step metadata check
of the latest, then a delete per object of each old step: Orbax writes a dozen objects per step). Done inline,
every commit stopped training for that long; a maintenance event adds two commits of its own (at the notice and
at the control plane's request), so each event paid it twice. Retention is housekeeping: nothing waits for it.
Here the loop only asks for it and trains on; one thread does it, at most one pass at a time (requests that arrive
during a pass make one more pass, not one each).

Why not Orbax's own ``max_to_keep``: it counts a step from the moment its save starts and prunes even when that
(async) save then fails to finalise, so the latest finalised step can go (interlude_workload.orbax_io says how).

Why it is safe next to a save in progress: a pass deletes only committed steps beyond the last ``keep`` of its own
listing (never the latest verified one) and unfinished leftovers *below* the latest verified step; a step being
saved is above every committed step (steps only grow in a run, and Orbax saves one step at a time), and the commit
markers are deleted first, so a half-deleted step never reads as committed (see ``CheckpointStore.retain``).

The pass uses a store with its own storage client: the library's HTTP session is not meant to be shared
between threads (the SDK's control-request poller has its own for the same reason).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from interlude_workload.checkpoints import CheckpointStore


class Retainer:
    """Runs ``store.retain(keep)`` in one background thread whenever :meth:`request` is called."""

    def __init__(self, make_store: Callable[[], CheckpointStore], keep: int, log: Callable[[str], None]) -> None:
        self._make_store = make_store
        self.keep = keep
        self._log = log
        self._cv = threading.Condition()
        self._due = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    def request(self) -> None:
        """Ask for a pass (returns at once). The thread starts with the first request."""
        if self.keep < 1:
            return
        with self._cv:
            if self._stopping:
                return
            self._due = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="interlude-retention", daemon=True)
                self._thread.start()
            self._cv.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Finish a pass that is due or running (the final commit's retention happens), then stop the thread."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _loop(self) -> None:
        store: CheckpointStore | None = None
        while True:
            with self._cv:
                while not self._due and not self._stopping:
                    self._cv.wait()
                if not self._due:
                    return
                self._due = False
            try:
                store = store or self._make_store()
                deleted = store.retain(self.keep)
                if deleted:
                    self._log(f"retention removed steps {deleted}")
            except Exception as exc:  # noqa: BLE001 - housekeeping: a failure must not stop training
                self._log(f"retention failed: {exc}")
