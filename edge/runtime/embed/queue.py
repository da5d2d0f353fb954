"""Embedding jobs on the engine thread: one batch per iteration, at most their share beside chat.

The step loop hands over the time its chat step took; `duty.embed_turn` decides
whether a batch runs now. A burst of requests delays chat by one batch at a time.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed, EdgeError
from edge.runtime.step.plan import embed_owed_after, embed_turn

if TYPE_CHECKING:
    from edge.runtime.embed.embedder import EmbedJob
    from edge.runtime.kv.residency import Residency

log = logging.getLogger("edge.engine")


class EmbedQueue:
    """Queued embedding jobs and the counters `EngineStats` reports."""

    def __init__(self) -> None:
        self.jobs: deque[EmbedJob] = deque()
        self.batches = 0
        self.inputs = 0
        self.beside_chat = 0  # chat steps that also ran an embedding batch (chat delayed)
        self._owed_s = 0.0  # chat time owed before the next batch beside chat

    def __bool__(self) -> bool:
        return bool(self.jobs)

    def extend(self, jobs: list[EmbedJob]) -> None:
        self.jobs.extend(jobs)

    def maybe_run(self, res: Residency, threads: int, chat_s: float, token_budget: int) -> float:
        """A batch if it is embeddings' turn; returns the seconds it took (0: none ran)."""
        turn = embed_turn(self._owed_s, chat_s)
        self._owed_s = turn.owed_s
        if not turn.run:
            return 0.0
        embed_s = self._batch(res, threads, token_budget, turn.beside_chat)
        if turn.beside_chat:
            self._owed_s = embed_owed_after(embed_s)
        return embed_s

    def _batch(self, res: Residency, threads: int, token_budget: int, beside_chat: bool) -> float:
        t0 = time.perf_counter()
        self.jobs = deque(j for j in self.jobs if not j.future.cancelled())  # the client went away
        if not self.jobs:
            return 0.0
        try:
            embedder = res.get_embedder(threads)
            embedder.set_threads(threads)
            done = embedder.run_batch(self.jobs, token_budget)
        except Exception as exc:  # cannot make the context (memory): fail the waiting jobs, keep chat
            log.warning("embeddings failed: %s", exc)
            self.fail(exc if isinstance(exc, EdgeError) else DecodeFailed(-1, f"embeddings failed: {exc}"))
            return time.perf_counter() - t0
        self.batches += 1
        self.inputs += done
        self.beside_chat += 1 if beside_chat else 0
        while self.jobs and self.jobs[0].done:
            job = self.jobs.popleft()
            if not job.future.done():
                job.future.set_result([v for v in job.vectors if v is not None])
        return time.perf_counter() - t0

    def fail(self, err: Exception, posted: list[EmbedJob] | tuple[EmbedJob, ...] = ()) -> None:
        """Fail every queued job (and `posted` ones not yet queued)."""
        for job in [*self.jobs, *posted]:
            if not job.future.done():
                job.future.set_exception(err)
        self.jobs.clear()
