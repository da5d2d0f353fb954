"""Per-request state inside the engine thread, and the step timings `edge bench` reads.

A `Sequence` lives from `submit()` until its final event: WAITING (queued,
no slot) -> PREFILL (slot held, prompt being evaluated in chunks) -> DECODE
(one token per step) -> finished. Only the engine thread mutates it after
submission; the consumer talks to it through its `RequestHandle`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge.runtime.engine.handle import RequestHandle, Wakeups
from edge.runtime.text.detok import TextStream
from edge.runtime.types import (
    EngineState,
    EngineStats,
    FinishReason,
    GenerationRequest,
    Knobs,
    TokenEvent,
    TokenLogprob,
    Usage,
)

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.llama.sampling import Sampler
    from edge.runtime.spec.state import SeqSpec
    from edge.runtime.step.think import ThinkState

log = logging.getLogger("edge.engine")


class Sequence:
    __slots__ = (
        "cached",
        "handle",
        "key",
        "max_tokens",
        "n_done",
        "n_gen",
        "n_unreported",
        "on_start",
        "out_idx",
        "pending_logprobs",
        "pending_tok",
        "prompt",
        "request",
        "sampler",
        "seq_id",
        "spec",
        "stream",
        "t_first_s",
        "t_submit_s",
        "think",
        "wakeups",
    )

    def __init__(
        self,
        request: GenerationRequest,
        prompt: list[int],
        sampler: Sampler,
        handle: RequestHandle,
        key: tuple[int, int],
        t_submit_s: float,
        on_start: Callable[[], None] | None = None,
        think: ThinkState | None = None,
    ) -> None:
        self.request = request
        self.prompt = prompt
        self.sampler: Sampler | None = sampler
        self.on_start = on_start
        self.handle = handle
        self.key = key
        self.max_tokens = request.max_tokens
        self.stream = TextStream(tuple(request.stop))
        self.seq_id = -1  # slot / llama seq id once admitted
        self.n_done = 0  # prompt tokens whose KV exists (reused + evaluated)
        self.cached = 0  # prompt tokens reused from a previous request's KV
        self.n_gen = 0  # tokens sampled
        self.n_unreported = 0  # sampled tokens not yet counted in an event
        self.pending_tok = -1  # sampled, to be decoded next step (-1: none)
        self.out_idx = -1  # batch row whose logits this sequence samples this step
        self.t_submit_s = t_submit_s
        self.t_first_s = -1.0
        self.wakeups: Wakeups | None = None  # the step loop's, once admitted: wake consumers per step
        self.pending_logprobs: list[TokenLogprob] = []  # sampled, not yet in an event (when asked)
        self.spec: SeqSpec | None = None  # speculation state once admitted (None: never drafts)
        self.think = think  # its think block: split, count, budget (None: text as it is)

    @property
    def n_prompt_left(self) -> int:
        return len(self.prompt) - self.n_done

    # --- what the step loop does to it (the engine thread only) ---------------------------
    def admit(self, seq_id: int, n_keep: int, wakeups: Wakeups, spec: SeqSpec | None) -> None:
        """It holds slot `seq_id`, whose first `n_keep` cells are its prompt's already."""
        self.seq_id, self.n_done, self.cached = seq_id, n_keep, n_keep
        self.wakeups, self.spec = wakeups, spec

    def at_row(self, row: int) -> None:
        """The batch row whose logits it samples next."""
        self.out_idx = row

    @property
    def drafting(self) -> bool:
        """It verifies a draft this step."""
        return self.spec is not None and bool(self.spec.draft)

    def decode_tokens(self) -> list[int]:
        """What it puts into a decode step: its pending token, then any draft to verify."""
        if self.spec is not None and self.spec.draft:
            return [self.pending_tok, *self.spec.draft]
        return [self.pending_tok]

    def committed_decode(self) -> list[int]:
        """Its decode step is in the KV cache: the tokens it put there (the draft's are
        verified after sampling, and the rejected tail removed)."""
        toks = self.decode_tokens()
        self.pending_tok = -1
        return toks

    def committed_prompt(self, n: int) -> list[int]:
        """`n` more prompt tokens are in the KV cache: those tokens."""
        toks = self.prompt[self.n_done : self.n_done + n]
        self.n_done += n
        return toks

    def sampled(self, clock: Clock) -> None:
        """One more token was sampled (counted before it is known whether it ends the sequence);
        the clock is read for the first one only (this runs for every token)."""
        self.n_gen += 1
        self.n_unreported += 1
        if self.t_first_s < 0:
            self.t_first_s = clock.monotonic()

    def carry(self, tok: int) -> None:
        """`tok` goes on: it is decoded next step, and the drafter learns it."""
        self.pending_tok = tok
        if self.spec is not None:
            self.spec.commit(tok)

    def started(self) -> None:
        """The sequence got its slot: tell whoever asked (admission counts it as running now)."""
        if self.on_start is not None:
            cb, self.on_start = self.on_start, None
            try:
                cb()
            except Exception:  # a bookkeeping callback must never take the engine thread down
                log.exception("on_start callback of request %s failed", self.handle.request_id)

    def emit(self, text: str) -> None:
        """One taken token's text (maybe empty: held back) to the handle."""
        reasoning = ""
        if self.think is not None:  # every token goes through it: it counts them
            text, reasoning = self.think.take(text)
        if text or reasoning:
            event = TokenEvent(text, self.n_unreported, logprobs=self._take_logprobs(), reasoning=reasoning)
            self.handle._push(event, self.wakeups)
            self.n_unreported = 0

    def _take_logprobs(self) -> tuple[TokenLogprob, ...]:
        if not self.pending_logprobs:
            return ()
        out, self.pending_logprobs = tuple(self.pending_logprobs), []
        return out

    def finish(self, reason: FinishReason, error: Exception | None = None) -> None:
        """Send the final event (with any held-back text) and release the sampler chain."""
        tail = self.stream.finish() if reason in (FinishReason.STOP, FinishReason.LENGTH) else ""
        reasoning, n_reasoning = "", 0
        if self.think is not None:
            tail, reasoning = self.think.finish(tail)
            n_reasoning = self.think.n_tokens
        usage = Usage(len(self.prompt), self.n_gen, self.cached, n_reasoning)
        self.handle._push(TokenEvent(tail, self.n_unreported, reason, usage, error, self._take_logprobs(),
                                     reasoning), self.wakeups)
        self.n_unreported = 0
        if self.sampler is not None:
            self.sampler.free()
            self.sampler = None


class StepPerf:
    """Cumulative step timings, for `edge bench engine` (Python overhead = step - decode - sample)."""

    __slots__ = ("decode_s", "n_decoded", "n_prefilled", "sample_s", "step_s", "steps")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.step_s = self.decode_s = self.sample_s = 0.0
        self.n_decoded = self.n_prefilled = 0

    def add(self, step_s: float, decode_s: float, sample_s: float, n_dec: int, n_pre: int) -> None:
        self.steps += 1
        self.step_s += step_s
        self.decode_s += decode_s
        self.sample_s += sample_s
        self.n_decoded += n_dec
        self.n_prefilled += n_pre


def empty_stats(state: EngineState, n_slots: int, knobs: Knobs, n_ctx: int) -> EngineStats:
    return EngineStats(state, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, n_ctx, n_slots, knobs)
