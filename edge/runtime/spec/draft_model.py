"""Drafting with a second, smaller model (`--speculative draft --draft-model NAME`).

The draft model has its own context on the engine thread, one sequence per slot like the
served model's, and decodes greedily: its guess for a sequence is the draft model's argmax
continuation of that sequence's tokens. A point-mass guess is what `rules.verify`'s
acceptance rule assumes, so output stays exactly the served model's (greedy identical,
sampled distribution unchanged).

What the draft context holds per sequence is tracked as a token list (`held`). Before drafting,
each sequence's KV is synced to its current tokens by their common prefix: the rejected tail
of the last guess, a finished request's leftovers, a new prompt's unshared part are removed
(`llama_memory_seq_rm`) and what is missing is decoded, all sequences in one batch. The
k guessed tokens then take k - 1 more one-token steps over every drafting sequence together.
A prompt cached in the served model's KV (prefix reuse) is usually still in the draft's too.

The seconds per drafted token are measured (`token_s`), so the step planner weighs a draft
token's cost against its expected gain.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Iterable, Mapping, Sequence

from edge.runtime.llama import llama_cpp
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.step.slots import common_prefix_len  # the target's prompt cache keeps by the same rule

log = logging.getLogger("edge.engine")

ALPHA = 0.2  # smoothing of the measured seconds per drafted token


class DraftModel:
    """The draft model's weights, context and batch, and what its KV holds per sequence."""

    def __init__(self, model: LlamaModel, n_ctx: int, n_seq: int, n_batch: int, n_threads: int,
                 kv_type: str = "f16") -> None:
        self.model = model
        self.ctx = LlamaContext(model, ContextConfig(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                                     n_seq_max=n_seq, n_threads=n_threads,
                                                     kv_type=kv_type, n_outputs_max=n_seq))
        self.batch = Batch(self.ctx.n_batch)
        self.n_vocab = model.n_vocab
        self.held: dict[int, list[int]] = {}
        self.token_s = 0.0  # measured seconds per drafted token (0.0: not measured yet)
        self.decoded_tokens = 0  # tokens the draft model decoded (catch-up and guesses)
        self._threads = n_threads

    def set_threads(self, n_threads: int) -> None:
        if n_threads != self._threads:
            self.ctx.set_threads(n_threads)
            self._threads = n_threads

    def draft(self, wants: Mapping[int, tuple[Sequence[int], int]]) -> dict[int, list[int]]:
        """{seq id: (its tokens so far, the pending one last; k)} -> up to k guessed tokens each.

        A sequence whose KV could not be synced (the draft context is full) gets no guess."""
        t0 = time.perf_counter()
        rows = self._sync({sid: toks for sid, (toks, k) in wants.items() if k > 0})
        out: dict[int, list[int]] = {sid: [] for sid in rows}
        left = {sid: wants[sid][1] for sid in rows}
        n_drafted = 0
        while rows:
            nxt: dict[int, int] = {}
            for sid, row in rows.items():
                tok = self._argmax(row)
                out[sid].append(tok)
                n_drafted += 1
                if len(out[sid]) < left[sid] and not self.model.is_eog(tok):
                    nxt[sid] = tok
            rows = self._step(nxt)
        if n_drafted:
            per = (time.perf_counter() - t0) / n_drafted
            self.token_s = per if self.token_s == 0.0 else self.token_s + ALPHA * (per - self.token_s)
        return out

    def retain(self, seq_ids: Iterable[int]) -> None:
        """Free the draft KV of every sequence not in `seq_ids` (the running ones): the served
        model's cache decides what idle prompts to keep; the draft's only follows its running ones."""
        keep = set(seq_ids)
        for sid in [s for s in self.held if s not in keep]:
            self.forget(sid)

    def forget(self, seq_id: int) -> None:
        """Free a sequence's draft KV (its slot was dropped or failed)."""
        if self.held.pop(seq_id, None) is not None:
            self.ctx.seq_rm(seq_id, -1, -1)

    def close(self) -> None:
        self.batch.free()
        self.ctx.close()
        self.model.close()

    # --- internals --------------------------------------------------------------------
    def _sync(self, tokens: Mapping[int, Sequence[int]]) -> dict[int, int]:
        """Make each sequence's draft KV hold its tokens; {seq id: logits row of its last token}.

        Catch-up first (everything but each last token, no logits, in as many batches as it
        takes), then one batch of the last tokens with logits: rows of an earlier batch are
        overwritten by the next decode."""
        rest: dict[int, list[int]] = {}
        for sid, toks in tokens.items():
            held = self.held.setdefault(sid, [])
            keep = min(common_prefix_len(held, toks), len(toks) - 1)  # the last one is decoded for its row
            if keep < len(held) and not self.ctx.seq_rm(sid, keep, -1):
                self.ctx.seq_rm(sid, -1, -1)
                keep = 0
            del held[keep:]
            rest[sid] = list(toks[keep:-1])
        cap = self.batch.capacity
        while any(rest.values()):
            self.batch.clear()
            fed: dict[int, int] = {}
            for sid, toks in rest.items():
                n = min(len(toks), cap - self.batch.n)
                if n > 0:
                    self.batch.add_prompt(sid, toks[:n], len(self.held[sid]), logits_last=False)
                    fed[sid] = n
            if not self._decode_or_reset():
                return {}
            for sid, n in fed.items():
                self.held[sid].extend(rest[sid][:n])
                del rest[sid][:n]
        return self._step({sid: tokens[sid][-1] for sid in rest})

    def _decode_or_reset(self) -> bool:
        if self.batch.decode(self.ctx.ptr) == 0:
            self.decoded_tokens += self.batch.n
            return True
        log.info("draft context full: its KV starts over")
        for sid in list(self.held):
            self.forget(sid)
        return False

    def _step(self, nxt: Mapping[int, int]) -> dict[int, int]:
        """Decode one guessed token per sequence; their logits rows (empty when done or full)."""
        if not nxt:
            return {}
        self.batch.clear()
        rows = {sid: self.batch.add_token(sid, tok, len(self.held[sid])) for sid, tok in nxt.items()}
        if not self._decode_or_reset():
            return {}
        for sid, tok in nxt.items():
            self.held[sid].append(tok)
        return rows

    def _argmax(self, row: int) -> int:
        import numpy as np  # here, not at the top: most starts never load a draft model

        ptr = llama_cpp.llama_get_logits_ith(self.ctx.ptr, row)
        logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (self.n_vocab,))
        return int(np.argmax(logits))
