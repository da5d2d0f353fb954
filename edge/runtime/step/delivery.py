"""Sampling and delivery of a step's tokens: the part of a step after `llama_decode`.

The step loop hands each sequence that produced logits to `Delivery.sample`: it samples one
token from the sequence's own sampler (or verifies its speculative draft row by row,
`spec.rules.verify`), and the text goes to its handle; a sequence that ends (EOG, a stop
string, max_tokens, a full context) goes back to the loop through `end`, one that fails
through `fail`. It owns no step state: the slots, clock and speculation are the loop's,
passed in.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed, EdgeError
from edge.runtime.llama.sampling import token_logprobs
from edge.runtime.spec.rules import verify
from edge.runtime.types import FinishReason, TokenLogprob

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.kv.residency import Live
    from edge.runtime.spec.state import SeqSpec, Speculation
    from edge.runtime.step.sequence import Sequence as Seq
    from edge.runtime.step.slots import Slot
    from edge.runtime.types import GenerationRequest

log = logging.getLogger("edge.engine")
SampleHook = Callable[["GenerationRequest", int], int]  # (request, token) -> token; tests inject faults


class Delivery:
    """Samples, verifies drafts and hands text over; `sample_s` counts sampling time."""

    def __init__(self, slots: Sequence[Slot], clock: Clock, spec: Speculation,
                 end: Callable[[Seq, FinishReason], None], fail: Callable[[Seq, Exception], None],
                 sample_hook: SampleHook | None = None) -> None:
        self.slots = slots
        self.clock = clock
        self.spec = spec
        self.end = end
        self.fail = fail
        self.sample_hook = sample_hook
        self.sample_s = 0.0

    def sample(self, live: Live, seq: Seq) -> None:
        """Sample one token for `seq` (or verify its draft) and hand the text over; errors fail
        this sequence only."""
        try:
            if seq.spec is not None and seq.spec.draft:
                self._verify(live, seq, seq.spec)
            else:
                forced = seq.think.next_forced() if seq.think is not None else None
                tok = self._sample_row(live, seq) if forced is None else forced  # a think block's close
                self._take(live, seq, tok, len(self.slots[seq.seq_id].tokens))
        except Exception as exc:
            log.warning("request %s failed while sampling: %s", seq.handle.request_id, exc)
            err = exc if isinstance(exc, EdgeError) else DecodeFailed(-1, f"sampling failed: {exc}")
            self.fail(seq, err)

    def _sample_row(self, live: Live, seq: Seq) -> int:
        assert seq.sampler is not None
        ts = time.perf_counter()
        tok = seq.sampler.sample(live.ctx.ptr, seq.out_idx)
        self.sample_s += time.perf_counter() - ts
        if self.sample_hook is not None:
            tok = self.sample_hook(seq.request, tok)
        return tok

    def _verify(self, live: Live, seq: Seq, sp: SeqSpec) -> None:
        """Accept the draft's agreeing prefix (spec.rules.verify), then remove the KV of the rest:
        slot.tokens and the KV stay equal whatever happened to the sequence meanwhile."""
        slot = self.slots[seq.seq_id]
        row0, draft = seq.out_idx, sp.draft
        base = len(slot.tokens) - len(draft)  # KV cells before the first drafted token

        def sample_row(i: int) -> int:
            seq.at_row(row0 + i)
            return self._sample_row(live, seq)

        n_acc = verify(draft, sample_row, lambda tok: self._take(live, seq, tok, base + seq.out_idx - row0))
        self.spec.settle(sp, n_acc)
        keep = base + n_acc
        if keep < len(slot.tokens):
            live.ctx.seq_rm(slot.seq_id, keep, -1)
            del slot.tokens[keep:]

    def _take(self, live: Live, seq: Seq, tok: int, n_kv: int) -> bool:
        """Hand one sampled token over (`n_kv`: cells the sequence holds before it); False when
        the sequence ended with it, or its think block is due to close (a draft stops there)."""
        model = live.model
        seq.sampled(self.clock)
        if model.is_eog(tok):
            self.end(seq, FinishReason.STOP)
            return False
        if seq.request.logprobs is not None:
            seq.pending_logprobs.append(self._logprob(live, seq, tok))
        think = seq.think
        text = seq.stream.feed(model.piece(tok) if think is None else model.piece(tok, think.special))
        if seq.stream.stopped:
            seq.emit(text)
            self.end(seq, FinishReason.STOP)
            return False
        if seq.n_gen >= seq.max_tokens or n_kv >= live.n_ctx_seq:
            seq.emit(text)
            self.end(seq, FinishReason.LENGTH)
            return False
        seq.carry(tok)
        seq.emit(text)
        return think is None or not think.due

    def _logprob(self, live: Live, seq: Seq, tok: int) -> TokenLogprob:
        model = live.model
        assert seq.request.logprobs is not None
        lp, top = token_logprobs(live.ctx.ptr, seq.out_idx, model.n_vocab, tok, seq.request.logprobs)

        def piece(t: int) -> tuple[str, bytes]:
            raw = model.piece(t)
            return raw.decode("utf-8", "replace"), raw

        text, raw = piece(tok)
        return TokenLogprob(text, raw, lp, tuple((*piece(t), v) for t, v in top))
