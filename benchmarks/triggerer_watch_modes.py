"""The watch designs that came before the shipped one, kept for benchmarks/triggerer_watch.py to compare.

The shipped :class:`~interlude.triggers.stage.StageTrigger` reads its stage's GCS facts from the bucket's listing
shared by every trigger in the process (one list per bucket and interval, a download only for an object that
changed). The designs it replaced read each stage's facts with the trigger's own calls
(:func:`interlude.stage.observe.read_stage_facts`: a list and up to four downloads per read, the sync path's way):

- ``naive``: every poll (``gcs_every=1``);
- ``before`` (issue 16): every poll while something happens, every third while calm (``gcs_every=3``).

:class:`PerStageReadsTrigger` is that design: the shipped trigger with the one method that reads the facts
overridden, so both run the same machine reads, state machine and logging side by side and only the GCS side
differs. It lives here, not in the shipped package, because nothing but the benchmark runs it. Airflow's triggerer
imports a trigger by the dotted path its ``serialize()`` returns (``triggerer_watch_modes.PerStageReadsTrigger``):
the benchmark puts this folder on the triggerer's PYTHONPATH (triggerer_watch.setup).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from interlude.stage.model import Machine, Phase, StageState
from interlude.stage.observe import StageFacts, read_stage_facts
from interlude.triggers.stage import StageTrigger

GCS_EVERY = 3  # the "before" design: while calm, GCS facts are read every third poll (machine state every poll)


class PerStageReadsTrigger(StageTrigger):
    """A StageTrigger that reads its own stage's GCS facts instead of the shared bucket listing.

    :param gcs_every: while calm (see :meth:`_calm`), read the facts every this many polls; 1 reads every poll.
    :param kwargs: the shipped StageTrigger's arguments (machine, bucket, run_key, stage, state, ...).
    """

    def __init__(self, *, gcs_every: int = GCS_EVERY, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if gcs_every < 1:
            raise ValueError(f"gcs_every must be at least 1, not {gcs_every}")
        self.gcs_every = gcs_every

    def serialize(self) -> tuple[str, dict[str, Any]]:
        path, kwargs = super().serialize()  # the path is type(self)'s: this module's, for the triggerer to import
        return path, {**kwargs, "gcs_every": self.gcs_every}

    @staticmethod
    def _calm(state: StageState, machine: Machine, notice: Any) -> bool:
        """Per-stage reads are the expensive look: every poll while anything is happening, else every few.
        A long notice (NOTICED: days ahead for a TPU) is calm too: its checkpoint is due at a set time."""
        return machine is Machine.READY and (
            (state.phase is Phase.RUNNING and notice is None) or state.phase is Phase.NOTICED
        )

    async def _read_facts(
        self, state: StageState, machine: Machine, notice: Any, facts: StageFacts | None, facts_at: float
    ) -> tuple[StageFacts, float]:
        due = time.monotonic() - facts_at >= self.poll_interval * self.gcs_every
        if facts is None or not self._calm(state, machine, notice) or due:
            facts = await asyncio.to_thread(read_stage_facts, self.bucket, self.run_key, self.stage, state.request_id)
            return facts, time.monotonic()
        return facts, facts_at
