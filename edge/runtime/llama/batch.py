"""The one preallocated llama_batch the engine fills every step.

Allocated once (`llama_batch_init`) and written field by field through cached
ctypes pointers: no per-step allocation, no per-token Python objects beyond the
ints themselves. Every token carries exactly one sequence id.
"""

from __future__ import annotations

from collections.abc import Sequence

from edge.runtime.llama import llama_cpp


class Batch:
    def __init__(self, n_batch: int) -> None:
        self.capacity = n_batch
        self.raw = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._tok = self.raw.token
        self._pos = self.raw.pos
        self._logits = self.raw.logits
        self._seq = [self.raw.seq_id[i] for i in range(n_batch)]
        for i in range(n_batch):
            self.raw.n_seq_id[i] = 1
        self.n = 0
        self._freed = False

    def clear(self) -> None:
        self.n = 0

    def add_token(self, seq_id: int, token: int, pos: int) -> int:
        """One decoding token with logits; returns its output row."""
        i = self.n
        self._tok[i] = token
        self._pos[i] = pos
        self._seq[i][0] = seq_id
        self._logits[i] = 1
        self.n = i + 1
        return i

    def add_tokens(self, seq_id: int, tokens: Sequence[int], pos0: int) -> int:
        """Tokens at positions pos0.. with logits (or embeddings) on every row: a token and its
        draft verified together, an embedding input; returns the first row."""
        tok, pos, logits, seqp = self._tok, self._pos, self._logits, self._seq
        i0 = i = self.n
        for j, t in enumerate(tokens):
            tok[i] = t
            pos[i] = pos0 + j
            seqp[i][0] = seq_id
            logits[i] = 1
            i += 1
        self.n = i
        return i0

    def add_prompt(self, seq_id: int, tokens: Sequence[int], pos0: int, logits_last: bool) -> int:
        """A prompt chunk at positions pos0.. ; returns the row of its last token."""
        tok, pos, logits, seqp = self._tok, self._pos, self._logits, self._seq
        i = self.n
        for j, t in enumerate(tokens):
            tok[i] = t
            pos[i] = pos0 + j
            seqp[i][0] = seq_id
            logits[i] = 0
            i += 1
        if logits_last:
            logits[i - 1] = 1
        self.n = i
        return i - 1

    def decode(self, ctx_ptr: object) -> int:
        self.raw.n_tokens = self.n
        return int(llama_cpp.llama_decode(ctx_ptr, self.raw))

    def encode(self, ctx_ptr: object) -> int:
        """llama_encode, for encoder-only models (embeddings)."""
        self.raw.n_tokens = self.n
        return int(llama_cpp.llama_encode(ctx_ptr, self.raw))

    def free(self) -> None:
        if not self._freed:
            self._freed = True
            llama_cpp.llama_batch_free(self.raw)
