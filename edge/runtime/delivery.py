"""Sampling and delivery of a step's tokens: the part of the step loop after `llama_decode`.

`StepLoop` inherits this: each sequence that produced logits samples one token from its own
sampler (or verifies its speculative draft row by row, `speculative.verify`), and the text goes
to its handle; a sequence that ends (EOG, a stop string, max_tokens, a full context) is finished
through the loop's `_end`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from edge.errors import DecodeFailed, EdgeError
from edge.runtime.sampling import token_logprobs
from edge.runtime.speculative import verify
from edge.runtime.types import FinishReason, TokenLogprob

if TYPE_CHECKING:
    from edge.clock import Clock
    from edge.runtime.residency import Live
    from edge.runtime.sequence import Sequence
    from edge.runtime.spec_step import SeqSpec, Speculation
    from edge.runtime.steploop import SampleHook
    from edge.runtime.stepplan import Slot

log = logging.getLogger("edge.engine")


class Delivery:
    """Mixed into StepLoop, whose state these methods use."""

    slots: list[Slot]
    clock: Clock
    sample_hook: SampleHook | None
    spec: Speculation
    _sample_s: float

    def _end(self, seq: Sequence, reason: FinishReason) -> None:
        raise NotImplementedError

    def _fail(self, seq: Sequence, err: Exception) -> None:
        raise NotImplementedError

    def _sample(self, live: Live, seq: Sequence) -> None:
        """Sample one token for `seq` (or verify its draft) and hand the text over; errors fail
        this sequence only."""
        try:
            if seq.spec is not None and seq.spec.draft:
                self._verify(live, seq, seq.spec)
            else:
                self._take(live, seq, self._sample_row(live, seq), len(self.slots[seq.seq_id].tokens))
        except Exception as exc:
            log.warning("request %s failed while sampling: %s", seq.handle.request_id, exc)
            err = exc if isinstance(exc, EdgeError) else DecodeFailed(-1, f"sampling failed: {exc}")
            self._fail(seq, err)

    def _sample_row(self, live: Live, seq: Sequence) -> int:
        assert seq.sampler is not None
        ts = time.perf_counter()
        tok = seq.sampler.sample(live.ctx.ptr, seq.out_idx)
        self._sample_s += time.perf_counter() - ts
        if self.sample_hook is not None:
            tok = self.sample_hook(seq.request, tok)
        return tok

    def _verify(self, live: Live, seq: Sequence, sp: SeqSpec) -> None:
        """Accept the draft's agreeing prefix (speculative.verify), then remove the KV of the rest:
        slot.tokens and the KV stay equal whatever happened to the sequence meanwhile."""
        slot = self.slots[seq.seq_id]
        row0, draft = seq.out_idx, sp.draft
        base = len(slot.tokens) - len(draft)  # KV cells before the first drafted token

        def sample_row(i: int) -> int:
            seq.out_idx = row0 + i
            return self._sample_row(live, seq)

        n_acc = verify(draft, sample_row, lambda tok: self._take(live, seq, tok, base + seq.out_idx - row0))
        self.spec.settle(sp, n_acc)
        keep = base + n_acc
        if keep < len(slot.tokens):
            live.ctx.seq_rm(slot.seq_id, keep, -1)
            del slot.tokens[keep:]

    def _take(self, live: Live, seq: Sequence, tok: int, n_kv: int) -> bool:
        """Hand one sampled token over (`n_kv`: cells the sequence holds before it); False when
        the sequence ended with it."""
        model = live.model
        seq.n_gen += 1
        seq.n_unreported += 1
        if seq.t_first_s < 0:
            seq.t_first_s = self.clock.monotonic()
        if model.is_eog(tok):
            self._end(seq, FinishReason.STOP)
            return False
        if seq.request.logprobs is not None:
            seq.pending_logprobs.append(self._logprob(live, seq, tok))
        text = seq.stream.feed(model.piece(tok))
        if seq.stream.stopped:
            seq.emit(text)
            self._end(seq, FinishReason.STOP)
            return False
        if seq.n_gen >= seq.max_tokens or n_kv >= live.n_ctx_seq:
            seq.emit(text)
            self._end(seq, FinishReason.LENGTH)
            return False
        seq.pending_tok = tok
        if seq.spec is not None:
            seq.spec.commit(tok)
        seq.emit(text)
        return True

    def _logprob(self, live: Live, seq: Sequence, tok: int) -> TokenLogprob:
        model = live.model
        assert seq.request.logprobs is not None
        lp, top = token_logprobs(live.ctx.ptr, seq.out_idx, model.n_vocab, tok, seq.request.logprobs)

        def piece(t: int) -> tuple[str, bytes]:
            raw = model.piece(t)
            return raw.decode("utf-8", "replace"), raw

        text, raw = piece(tok)
        return TokenLogprob(text, raw, lp, tuple((*piece(t), v) for t, v in top))

