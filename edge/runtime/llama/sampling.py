"""Sampler chains in llama.cpp, one per sequence, and validation of `SamplingParams`.

Per-token work on logits happens in C: the chain is
logit-bias -> penalties -> grammar -> (greedy | top-k -> top-p -> min-p -> temp -> dist(seed)),
the order llama.cpp's own `common_sampler` uses, and Python calls
`llama_sampler_sample(chain, ctx, i)` once per generated token; except greedy decoding with no
penalties or grammar, which is one numpy argmax over the row (`GreedySampler`).

Validation runs in the caller's thread at submit time, so a bad value is an
`InvalidRequest` before the request is queued, never a failure mid-stream.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import random
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from edge.contracts.options import PENALTY_ABS_MAX, REPEAT_PENALTY_MAX, TEMPERATURE_MAX
from edge.errors import InvalidRequest
from edge.runtime.llama import llama_cpp
from edge.runtime.types import SamplingParams

if TYPE_CHECKING:  # numpy is imported where a sample needs it: 50-70 ms that no start should wait for
    import numpy as np

SamplerPtr = Any  # ctypes pointer to struct llama_sampler


class Sampler(Protocol):
    """What a sequence samples with: one token from a batch row's logits; `free` once."""

    def sample(self, ctx: Any, idx: int) -> int: ...

    def free(self) -> None: ...


class ChainSampler:
    """A plain llama.cpp sampler chain."""

    __slots__ = ("chain",)

    def __init__(self, chain: SamplerPtr) -> None:
        self.chain = chain

    def sample(self, ctx: Any, idx: int) -> int:
        return int(llama_cpp.llama_sampler_sample(self.chain, ctx, idx))

    def free(self) -> None:
        free_chain(self.chain)
        self.chain = None


def validate_sampling(p: SamplingParams, n_vocab: int) -> None:
    """Raise `InvalidRequest` naming the first out-of-range field. The bounds are those both HTTP
    schemas declare (edge.contracts.options), so every entry point refuses the same values."""

    def bad(param: str, why: str) -> InvalidRequest:
        return InvalidRequest(f"{param} {why}", param=param)

    if not (math.isfinite(p.temperature) and 0 <= p.temperature <= TEMPERATURE_MAX):
        raise bad("temperature", f"must be in [0, {TEMPERATURE_MAX:g}], got {p.temperature}")
    if p.top_k < 0:
        raise bad("top_k", f"must be >= 0 (0 disables), got {p.top_k}")
    if not (math.isfinite(p.top_p) and 0.0 < p.top_p <= 1.0):
        raise bad("top_p", f"must be in (0, 1], got {p.top_p}")
    if not (math.isfinite(p.min_p) and 0.0 <= p.min_p <= 1.0):
        raise bad("min_p", f"must be in [0, 1], got {p.min_p}")
    if not (math.isfinite(p.repeat_penalty) and 0 < p.repeat_penalty <= REPEAT_PENALTY_MAX):
        raise bad("repeat_penalty",
                  f"must be in (0, {REPEAT_PENALTY_MAX:g}] (1 disables), got {p.repeat_penalty}")
    if p.repeat_last_n < -1:
        raise bad("repeat_last_n", f"must be >= -1, got {p.repeat_last_n}")
    for name in ("frequency_penalty", "presence_penalty"):
        v = getattr(p, name)
        if not (math.isfinite(v) and -PENALTY_ABS_MAX <= v <= PENALTY_ABS_MAX):
            raise bad(name, f"must be in [{-PENALTY_ABS_MAX:g}, {PENALTY_ABS_MAX:g}], got {v}")
    if p.seed is not None and not (0 <= p.seed < 2**32 - 1):
        raise bad("seed", f"must be in [0, 2^32 - 2], got {p.seed}")
    for tok, bias in p.logit_bias.items():
        if not isinstance(tok, int) or isinstance(tok, bool) or not (0 <= tok < n_vocab):
            raise bad("logit_bias", f"token id {tok!r} is not in the vocabulary (0..{n_vocab - 1})")
        if math.isnan(bias) or bias == math.inf:
            raise bad("logit_bias", f"bias for token {tok} must be a number or -inf, got {bias}")
    if p.grammar is not None and not p.grammar.strip():
        raise bad("grammar", "must not be empty")


def build_chain(
    p: SamplingParams,
    vocab: Any,
    n_vocab: int,
    *,
    seed_source: Callable[[], int] = lambda: random.getrandbits(32) % (2**32 - 1),
) -> SamplerPtr:
    """A fresh llama.cpp sampler chain for one sequence; the caller frees it with `free_chain`.

    Raises `InvalidRequest` when the grammar does not parse. Assumes `validate_sampling` passed.
    """
    params = llama_cpp.llama_sampler_chain_default_params()
    params.no_perf = True
    chain = llama_cpp.llama_sampler_chain_init(params)
    add = llama_cpp.llama_sampler_chain_add
    try:
        if p.logit_bias:
            arr = (llama_cpp.llama_logit_bias * len(p.logit_bias))()
            for i, (tok, bias) in enumerate(p.logit_bias.items()):
                arr[i].token = tok
                arr[i].bias = -math.inf if bias == -math.inf else float(bias)
            add(chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(p.logit_bias), arr))
        if p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            add(
                chain,
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab, p.repeat_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                ),
            )
        if p.grammar is not None:
            g = llama_cpp.llama_sampler_init_grammar(vocab, p.grammar.encode("utf-8"), b"root")
            if not g:
                raise InvalidRequest("grammar does not parse as GBNF with a 'root' rule", param="grammar")
            add(chain, g)
        if p.temperature == 0.0:
            add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            if p.top_k > 0:
                add(chain, llama_cpp.llama_sampler_init_top_k(p.top_k))
            if p.top_p < 1.0:
                add(chain, llama_cpp.llama_sampler_init_top_p(p.top_p, 1))
            if p.min_p > 0.0:
                add(chain, llama_cpp.llama_sampler_init_min_p(p.min_p, 1))
            add(chain, llama_cpp.llama_sampler_init_temp(p.temperature))
            seed = p.seed if p.seed is not None else seed_source()
            add(chain, llama_cpp.llama_sampler_init_dist(seed))
    except BaseException:
        llama_cpp.llama_sampler_free(chain)
        raise
    return chain


def free_chain(chain: SamplerPtr) -> None:
    if chain:
        llama_cpp.llama_sampler_free(chain)


LogitsRow = Callable[[Any, int, int], "np.ndarray"]  # (ctx, batch row, n_vocab) -> that row's logits


def logits_row(ctx: Any, idx: int, n_vocab: int) -> np.ndarray:
    """Batch row `idx`'s logits as llama.cpp holds them (a view, no copy)."""
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(ctx, idx)
    if not ptr:
        raise RuntimeError(f"llama.cpp has no logits for batch row {idx}")
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,))


def import_numpy() -> None:
    """Import numpy, for `GreedySampler`. A server calls this once its start is over: imported by
    the first greedy request instead, it cost that request's first token 60-100 ms on 2 cores
    (a third of SmolLM2's), where the chain costs 0.05-0.3 ms a token more. An import still
    running in this thread makes a sampler built meanwhile wait for it (the import lock)."""
    import numpy  # noqa: F401


class GreedySampler:
    """Temperature 0 without penalties or grammar: the highest logit after `logit_bias`, found
    by numpy in the row llama.cpp wrote. A chain first copies the whole vocabulary into
    candidate structs (`llama_token_data`, 12 bytes each) and scans those: 0.28-0.35 ms a token
    on Gemma 3's 262k vocabulary, 0.17 ms on Qwen2.5's 152k, against 0.02-0.05 ms here (2-core
    EPYC), paid for every emitted token and, while speculating, every verified draft row. The
    choice is the chain's: biases added in float32 as llama.cpp adds them, and of equal logits
    the lowest token id, as llama.cpp's greedy sampler keeps the first. Greedy and logit-bias
    samplers keep no state, so nothing needs accepting.

    With biases (a benchmark's banned end tokens, a client's `logit_bias`) the row is not copied
    unless it must be: the unbiased best token wins unless it is itself biased or a biased token
    reaches its logit, which the few biased logits alone decide (a 1 MB copy and add less per
    token on a 262k vocabulary, 0.15 ms here)."""

    __slots__ = ("_add_at", "_bias", "_copyto", "_id_set", "_ids", "_row", "_scratch", "n_vocab")

    def __init__(self, logit_bias: dict[int, float], n_vocab: int, row: LogitsRow = logits_row) -> None:
        import numpy as np

        self.n_vocab = n_vocab
        self._copyto, self._add_at = np.copyto, np.add.at
        self._row = row
        self._ids = np.fromiter(logit_bias, dtype=np.int64, count=len(logit_bias))
        self._id_set = frozenset(int(i) for i in logit_bias)
        self._bias = np.fromiter(logit_bias.values(), dtype=np.float32, count=len(logit_bias))
        self._scratch = np.empty(n_vocab if logit_bias else 0, dtype=np.float32)

    def sample(self, ctx: Any, idx: int) -> int:
        logits = self._row(ctx, idx, self.n_vocab)
        best = int(logits.argmax())  # the lowest id of the highest logit
        if not self._ids.size:
            return best
        if best not in self._id_set:
            biased = logits[self._ids] + self._bias  # float32, as the chain adds them
            top, plain = biased.max(), logits[best]
            if top < plain:
                return best
            winners = self._ids[biased == top]  # empty only for a NaN: the whole row decides
            if winners.size:
                lowest = int(winners.min())
                return lowest if top > plain else min(lowest, best)
        self._copyto(self._scratch, logits)
        self._add_at(self._scratch, self._ids, self._bias)
        return int(self._scratch.argmax())

    def free(self) -> None:
        """Nothing is held outside Python."""


class GrammarFirstLast:
    """Grammar-constrained sampling without running the grammar over the whole vocabulary
    on every token (what llama.cpp's `common_sampler` does): sample with the chain minus
    the grammar, check that one token against the grammar, and only when it is rejected
    resample with the full chain (grammar applied to every candidate).

    Used only without penalties: the fast chain has accepted the rejected token, which is
    harmless for greedy/dist state but would skew penalty history.
    """

    def __init__(self, p: SamplingParams, vocab: Any, n_vocab: int) -> None:
        self.full = build_chain(p, vocab, n_vocab)
        try:
            self.fast = build_chain(dataclasses.replace(p, grammar=None), vocab, n_vocab)
        except BaseException:
            free_chain(self.full)
            raise
        self.grammar = llama_cpp.llama_sampler_chain_get(self.full, 1 if p.logit_bias else 0)
        self._cell = llama_cpp.llama_token_data()
        self._one = llama_cpp.llama_token_data_array(ctypes.pointer(self._cell), 1, -1, False)
        self._one_p = ctypes.byref(self._one)

    def sample(self, ctx: Any, idx: int) -> int:
        tok = llama_cpp.llama_sampler_sample(self.fast, ctx, idx)
        cell = self._cell
        cell.id, cell.logit, cell.p = tok, 1.0, 0.0
        self._one.size, self._one.selected, self._one.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(self.grammar, self._one_p)
        if math.isfinite(cell.logit):
            llama_cpp.llama_sampler_accept(self.full, tok)  # grammar (and bias) state advance
            return tok
        return int(llama_cpp.llama_sampler_sample(self.full, ctx, idx))

    def free(self) -> None:
        free_chain(self.fast)
        free_chain(self.full)
        self.fast = self.full = None  # free_chain(None) is a no-op: freeing twice is harmless


def build_sampler(p: SamplingParams, vocab: Any, n_vocab: int) -> Sampler:
    """A plain chain; greedy decoding without penalties or grammar in numpy (a chain, which picks
    the same token, while numpy is not imported yet: `import_numpy`); the grammar fast path when
    a grammar is set and no penalties are."""
    no_penalties = p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0
    if p.grammar is None and no_penalties and p.temperature == 0.0 and "numpy" in sys.modules:
        return GreedySampler(p.logit_bias, n_vocab)
    if p.grammar is not None and no_penalties:
        return GrammarFirstLast(p, vocab, n_vocab)
    return ChainSampler(build_chain(p, vocab, n_vocab))


def token_logprobs(ctx: Any, idx: int, n_vocab: int, token: int,
                   top_n: int) -> tuple[float, list[tuple[int, float]]]:
    """Log probability of `token` from batch row `idx`'s raw logits, and the `top_n` best alternatives.

    Only called for requests that ask (OpenAI `logprobs`): one log-softmax over the vocabulary
    in float64, from the logits llama.cpp already holds (no copy of them is kept).
    """
    import numpy as np

    logits = logits_row(ctx, idx, n_vocab).astype(np.float64)
    m = float(logits.max())
    lse = m + math.log(float(np.exp(logits - m).sum()))
    top: list[tuple[int, float]] = []
    if top_n > 0:
        k = min(top_n, n_vocab)
        ids = np.argpartition(-logits, k - 1)[:k]
        ids = ids[np.argsort(-logits[ids], kind="stable")]
        top = [(int(i), float(logits[i] - lse)) for i in ids]
    return float(logits[token] - lse), top


def json_schema_to_grammar(schema: dict[str, Any] | str | None) -> str:
    """GBNF for `response_format`: a JSON schema, or any JSON object when `schema` is None."""
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    if schema is None:
        return JSON_GBNF
    try:
        text = schema if isinstance(schema, str) else json.dumps(schema)
        return json_schema_to_gbnf(text)
    except Exception as exc:  # the converter raises plain Exceptions on unsupported schemas
        raise InvalidRequest(f"unsupported JSON schema: {exc}", param="response_format") from exc
