"""Embeddings on their own context over already-loaded weights, run by the engine thread.

`Embedder` owns a second llama_context (embeddings on, pooled per sequence)
created on the same `llama_model` the chat context uses, or on a second model
named for embeddings. The engine thread runs at most one embedding batch per
step (`StepLoop`), so a burst of embedding requests delays chat decoding by one
batch at a time, never by the whole burst. A batch packs several inputs as
separate sequences (up to `MAX_SEQS`, and up to the engine's step token budget,
the same bound a prompt chunk has; a longer single input goes alone), and every
vector is L2-normalised, as sentence-embedding models are used.

Pooling comes from the GGUF (`{arch}.pooling_type`: mean, cls, last); a model
that names none (a causal LM) is mean-pooled.
"""

from __future__ import annotations

import concurrent.futures
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge.errors import ContextOverflow, DecodeFailed, InvalidRequest
from edge.runtime.llama import llama_cpp
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel

if TYPE_CHECKING:  # imported by the first embedding, not by every start (50-70 ms)
    import numpy as np

BATCH_TOKENS = 2048  # the longest single input (one is embedded in one go: pooling sees it whole)
MAX_SEQS = 16  # inputs per batch
MAX_INPUTS = 2048  # per request, as OpenAI
POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}
POOLING_IDS = {v: k for k, v in POOLING.items()}


@dataclass
class EmbedJob:
    """One request's inputs (token ids) and where its vectors go; filled batch by batch."""

    inputs: list[list[int]]
    future: concurrent.futures.Future[list[np.ndarray]] = field(default_factory=concurrent.futures.Future)
    vectors: list[np.ndarray | None] = field(default_factory=list)
    next_input: int = 0

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)

    @property
    def done(self) -> bool:
        return self.next_input >= len(self.inputs)

    @property
    def n_tokens(self) -> int:
        return sum(len(x) for x in self.inputs)


def pooling_of(model: LlamaModel) -> int:
    """The GGUF's pooling type, or mean for a model that names none (a causal LM)."""
    arch = model.meta("general.architecture") or ""
    raw = model.meta(f"{arch}.pooling_type")
    try:
        value = int(raw) if raw is not None else 0
    except ValueError:
        value = 0
    return value if value in (1, 2, 3) else 1


def max_input_tokens(model: LlamaModel) -> int:
    """The longest input one sequence may hold: the batch, or the model's trained context if shorter."""
    return min(BATCH_TOKENS, model.n_ctx_train) if model.n_ctx_train > 0 else BATCH_TOKENS


def prepare_inputs(vocab: LlamaModel, inputs: Sequence[str | list[int]],
                   truncate: bool = False) -> list[list[int]]:
    """Token ids of every input, checked: InvalidRequest / ContextOverflow name the bad one
    (`truncate`: a too-long input keeps its first tokens instead, as Ollama's /api/embed does)."""
    if not inputs:
        raise InvalidRequest("input must not be empty", param="input")
    if len(inputs) > MAX_INPUTS:
        raise InvalidRequest(f"{len(inputs)} inputs; at most {MAX_INPUTS} per request", param="input")
    limit = max_input_tokens(vocab)
    out: list[list[int]] = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            toks = vocab.tokenize(item, add_bos=True, parse_special=False)
        else:
            toks = list(item)
        if not toks:
            raise InvalidRequest(f"input[{i}] is empty", param=f"input[{i}]")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab.n_vocab for t in toks):
            raise InvalidRequest(f"input[{i}] has token ids outside the vocabulary", param=f"input[{i}]")
        if len(toks) > limit:
            if not truncate:
                raise ContextOverflow(len(toks), limit)
            toks = toks[:limit]
        out.append(toks)
    return out


def describe(vocab: LlamaModel) -> dict[str, Any]:
    """Model name, vector size, pooling and input limit, from metadata (a vocab-only model will do)."""
    arch = vocab.meta("general.architecture") or ""
    n_embd = vocab.meta(f"{arch}.embedding_length")
    return {"model": Path(vocab.path).stem, "n_embd": int(n_embd) if n_embd else None,
            "pooling": POOLING.get(pooling_of(vocab), "mean"), "max_input_tokens": max_input_tokens(vocab)}


class Embedder:
    """The embeddings context over `model` (not owned: the engine's weights, or a second model)."""

    def __init__(self, model: LlamaModel, n_threads: int) -> None:
        self.model = model
        self.pooling = pooling_of(model)
        self.n_embd = int(llama_cpp.llama_model_n_embd(model.ptr))
        self.max_tokens = max_input_tokens(model)
        n = self.max_tokens
        cfg = ContextConfig(n_ctx=n, n_batch=n, n_ubatch=n, n_seq_max=MAX_SEQS, n_threads=n_threads,
                            n_outputs_max=n, embeddings=True, pooling=self.pooling)
        self.ctx = LlamaContext(model, cfg)
        self.batch = Batch(n)
        self._encoder_only = bool(llama_cpp.llama_model_has_encoder(model.ptr)) and not bool(
            llama_cpp.llama_model_has_decoder(model.ptr))

    @property
    def pooling_name(self) -> str:
        return POOLING.get(self.pooling, "mean")

    def run_batch(self, queue: deque[EmbedJob], token_cap: int) -> int:
        """Embed the next inputs of the queue's first jobs (one llama batch of at most `token_cap`
        tokens, or one longer input alone); returns inputs done."""
        picks: list[tuple[EmbedJob, int]] = []
        used = 0
        cap = min(token_cap, self.max_tokens)
        for job in queue:
            while not job.done and len(picks) < MAX_SEQS:
                n = len(job.inputs[job.next_input])
                if picks and used + n > cap:
                    break
                picks.append((job, job.next_input))
                job.next_input += 1
                used += n
            if len(picks) >= MAX_SEQS or (not job.done):
                break
        if not picks:
            return 0
        b = self.batch
        b.clear()
        for s, (job, i) in enumerate(picks):
            b.add_tokens(s, job.inputs[i], 0)
        self.ctx.clear()
        rc = b.encode(self.ctx.ptr) if self._encoder_only else b.decode(self.ctx.ptr)
        if rc != 0:
            err = DecodeFailed(rc, "embedding batch failed")
            for job, _ in picks:
                if not job.future.done():
                    job.future.set_exception(err)
            return len(picks)
        import numpy as np

        for s, (job, i) in enumerate(picks):
            ptr = llama_cpp.llama_get_embeddings_seq(self.ctx.ptr, s)
            vec = np.array(np.ctypeslib.as_array(ptr, shape=(self.n_embd,)), dtype=np.float32)
            norm = float(np.linalg.norm(vec))
            job.vectors[i] = vec / norm if norm > 0 else vec
        return len(picks)

    def set_threads(self, n_threads: int) -> None:
        self.ctx.set_threads(n_threads)

    def close(self) -> None:
        self.batch.free()
        self.ctx.close()
