"""Perplexity of a model over a text, from the engine's own logits: strided windows.

The standard method for a fixed-length model (Hugging Face's "perplexity of fixed-length
models"; llama.cpp's `llama-perplexity --ppl-stride`): windows of `n_ctx` tokens advance by
`stride`; each window scores only the tokens the previous one did not, conditioning on the
rest, so every token after the first is scored exactly once and (after the first window)
with at least n_ctx - stride tokens of context. PPL = exp(mean negative log-likelihood).

A model whose tokenizer adds BOS gets BOS in front of every window (in llama.cpp's
perplexity it overwrites the window's first token instead): each window then starts as the
model was trained to start, the first text token is scored too, and a window holds
n_ctx - 1 text tokens.

The window arithmetic and the log-softmax are pure functions (tested without a model);
`evaluate()` drives llama.cpp through `edge.runtime.llama.model` (the one place contexts are
made), reading logits with llama_get_logits_ith into numpy, log-softmax in float64.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge.errors import InvalidRequest

LOGITS_BUDGET_BYTES = 32 << 20  # float32 logits rows one llama_decode may return (x n_vocab)
MIN_LOGITS_ROWS, MAX_BATCH = 16, 512
_PROBE_TOKENS = 8  # token ids compared between two vocabularies besides size and a tokenization


@dataclass(frozen=True)
class Window:
    """Text tokens [begin, end) go through the model; [score_from, end) are scored."""

    begin: int
    end: int
    score_from: int

    @property
    def n_scored(self) -> int:
        return self.end - self.score_from


def plan_windows(n_tokens: int, window: int, stride: int, *, bos_prefix: bool = False) -> list[Window]:
    """Windows of at most `window` text tokens starting every `stride` tokens; the last one ends
    at the text's end. Without a BOS prefix a window's first token has nothing before it, so it
    cannot be scored: the first token of the text is never scored, and `stride` must leave at
    least one token of overlap. Every other token is scored by exactly one window."""
    lead = 0 if bos_prefix else 1  # tokens at a window's start that nothing precedes
    if window < 1 or not 1 <= stride <= window - lead or n_tokens < window:
        raise ValueError(f"need 1 <= stride <= window - {lead} and n_tokens >= window "
                         f"(n_tokens={n_tokens}, window={window}, stride={stride})")
    out: list[Window] = []
    prev_end, begin = lead, 0
    while True:
        end = min(begin + window, n_tokens)
        out.append(Window(begin, end, max(prev_end, begin + lead)))
        if end == n_tokens:
            return out
        prev_end, begin = end, begin + stride


def plan_for_text(n_text_tokens: int, n_ctx: int, stride: int, *, bos_prefix: bool) -> list[Window]:
    """plan_windows for a context of `n_ctx` tokens (BOS included), with the CLI's words for
    what is wrong (InvalidRequest naming --ctx, --stride or the text)."""
    window = n_ctx - (1 if bos_prefix else 0)
    lead = 0 if bos_prefix else 1
    if window < 2:
        raise InvalidRequest(f"--ctx {n_ctx} is too small for a window", "ctx")
    if not 1 <= stride <= window - lead:
        raise InvalidRequest(
            f"--stride {stride} must be between 1 and {window - lead} for --ctx {n_ctx} "
            "(windows must overlap so that every token is scored)", "stride")
    if n_text_tokens < window:
        bos = " plus BOS" if bos_prefix else ""
        raise InvalidRequest(
            f"the text is {n_text_tokens} tokens but one window needs {window}{bos} (--ctx {n_ctx}); "
            "give a longer --text or a smaller --ctx", "text")
    return plan_windows(n_text_tokens, window, stride, bos_prefix=bos_prefix)


def token_nll(logits: np.ndarray, targets: np.ndarray | Sequence[int]) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] per row, in float64 (a 49k-way float32 sum loses
    digits that a 1 % PPL comparison needs)."""
    x = np.asarray(logits, dtype=np.float64)
    t = np.asarray(targets, dtype=np.int64)
    top = x.max(axis=1)
    lse = top + np.log(np.exp(x - top[:, None]).sum(axis=1))
    return np.asarray(lse - x[np.arange(len(t)), t])


def perplexity(total_nll: float, n_scored: int) -> float:
    return math.exp(total_nll / n_scored) if n_scored else math.nan


def logits_rows(n_vocab: int) -> int:
    """Output rows per llama_decode within LOGITS_BUDGET_BYTES (170 for a 49k vocabulary, 32
    for a 262k one): the logits buffer llama.cpp allocates is rows x n_vocab floats."""
    return max(MIN_LOGITS_ROWS, min(MAX_BATCH, LOGITS_BUDGET_BYTES // (4 * n_vocab)))


def chunk_window(length: int, out_from: int, n_batch: int, n_rows: int) -> list[tuple[int, int]]:
    """Split positions [0, length) into llama_decode chunks of at most `n_batch` tokens, each
    asking logits for at most `n_rows` of the positions [out_from, length - 1)."""
    chunks: list[tuple[int, int]] = []
    pos = 0
    while pos < length:
        size = min(n_batch, length - pos)
        n_out = max(0, min(pos + size, length - 1) - max(pos, out_from))
        if n_out > n_rows:
            size = max(out_from - pos, 0) + n_rows
        chunks.append((pos, pos + size))
        pos += size
    return chunks


@dataclass(frozen=True)
class PerplexityResult:
    model: str  # the file's name
    n_tokens: int  # tokens of the text
    n_scored: int
    n_windows: int
    n_decoded: int  # tokens run through the model (windows overlap, so more than n_tokens)
    n_ctx: int
    stride: int
    mean_nll: float  # nats per scored token
    ppl: float
    eval_s: float  # the windows' decoding and scoring, without loading

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def relative_change_pct(base: float, other: float) -> float:
    """(other - base) / base in percent: how much worse (positive) `other` predicts the text."""
    return (other - base) / base * 100.0


class Vocab(Protocol):
    """What the vocabulary comparison needs (LlamaModel has it; tests use a fake)."""

    n_vocab: int
    add_bos: bool

    def piece(self, token: int, special: bool = False) -> bytes: ...

    def tokenize(self, text: str, add_bos: bool = True, parse_special: bool = True) -> list[int]: ...


def vocab_difference(a: Vocab, b: Vocab, text: str) -> str | None:
    """Why two models' perplexities on `text` are not comparable (another tokenization), or
    None: the vocabulary size, BOS use, a few token ids' texts and the text's tokens."""
    if a.n_vocab != b.n_vocab:
        return f"vocabulary sizes differ ({a.n_vocab} vs {b.n_vocab} tokens)"
    if a.add_bos != b.add_bos:
        return f"one model adds BOS and the other does not ({a.add_bos} vs {b.add_bos})"
    n = a.n_vocab
    for tok in sorted({min(n - 1, i * n // _PROBE_TOKENS) for i in range(_PROBE_TOKENS)} | {n - 1}):
        pa, pb = a.piece(tok, special=True), b.piece(tok, special=True)
        if pa != pb:
            return f"token {tok} is {pa!r} in one vocabulary and {pb!r} in the other"
    ta = a.tokenize(text, add_bos=False, parse_special=False)
    tb = b.tokenize(text, add_bos=False, parse_special=False)
    if ta != tb:
        i = next((k for k, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y), min(len(ta), len(tb)))
        return (f"the text tokenizes differently ({len(ta)} vs {len(tb)} tokens, "
                f"first difference at token {i})")
    return None


def check_same_vocab(path_a: str | Path, path_b: str | Path, text: str) -> None:
    """InvalidRequest(param 'against') when the two models tokenize differently: PPL is only
    comparable on the same tokens. Loads the vocabularies only (a few MiB)."""
    from edge.runtime.llama.model import LlamaModel

    a = LlamaModel(path_a, vocab_only=True)
    try:
        b = LlamaModel(path_b, vocab_only=True)
        try:
            why = vocab_difference(a, b, text)
        finally:
            b.close()
    finally:
        a.close()
    if why is not None:
        raise InvalidRequest(
            f"{Path(path_a).name} and {Path(path_b).name} have incompatible vocabularies: {why}; "
            "perplexity is only comparable on the same tokenization", "against")


Progress = Callable[[int, int], None]  # (tokens scored so far, tokens to score)


def evaluate(path: str | Path, text: str, *, n_ctx: int, stride: int, n_threads: int,
             n_gpu_layers: int = 0, progress: Progress | None = None,
             timer: Callable[[], float] = time.perf_counter) -> PerplexityResult:
    """Perplexity of the model at `path` (validated and planned by the caller) over `text`.
    Raises InvalidRequest before decoding anything when the text or the window sizes do not
    fit, ModelLoadError, DecodeFailed."""
    from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel

    model = LlamaModel(path, n_gpu_layers=n_gpu_layers)
    try:
        bos = model.add_bos and model.bos_id >= 0
        tokens = model.tokenize(text, add_bos=False, parse_special=False)
        windows = plan_for_text(len(tokens), n_ctx, stride, bos_prefix=bos)
        rows = logits_rows(model.n_vocab)
        cfg = ContextConfig(n_ctx=n_ctx, n_batch=min(MAX_BATCH, n_ctx), n_ubatch=min(MAX_BATCH, n_ctx),
                            n_seq_max=1, n_threads=n_threads, n_outputs_max=rows)
        ctx = LlamaContext(model, cfg)
        try:
            return _score(model, ctx, tokens, windows, bos, rows, n_ctx, stride, progress, timer)
        finally:
            ctx.close()
    finally:
        model.close()


def _score(model: Any, ctx: Any, tokens: list[int], windows: list[Window], bos: bool, rows: int,
           n_ctx: int, stride: int, progress: Progress | None,
           timer: Callable[[], float]) -> PerplexityResult:
    from edge.errors import DecodeFailed
    from edge.runtime.llama import llama_cpp
    from edge.runtime.llama.batch import Batch

    total = sum(w.n_scored for w in windows)
    prefix = [model.bos_id] if bos else []
    batch = Batch(ctx.n_batch)
    nll_sum, n_scored, n_decoded = 0.0, 0, 0
    t0 = timer()
    try:
        for w in windows:
            seq = prefix + tokens[w.begin:w.end]
            # logits at window position q predict the token at q + 1
            out_from = len(prefix) + w.score_from - w.begin - 1
            ctx.clear()
            for c0, c1 in chunk_window(len(seq), out_from, ctx.n_batch, rows):
                batch.clear()
                split = min(max(out_from, c0), c1)
                out_end = min(c1, len(seq) - 1)
                if split > c0:
                    batch.add_prompt(0, seq[c0:split], c0, logits_last=False)
                out_rows = [batch.add_token(0, seq[q], q) for q in range(split, out_end)]
                if out_end < c1:  # the window's last token: no prediction needed from it
                    batch.add_prompt(0, seq[out_end:c1], out_end, logits_last=False)
                rc = batch.decode(ctx.ptr)
                if rc != 0:
                    raise DecodeFailed(rc, f"perplexity window {w.begin}-{w.end}")
                if out_rows:
                    logits = np.empty((len(out_rows), model.n_vocab), dtype=np.float64)
                    for k, row in enumerate(out_rows):
                        ptr = llama_cpp.llama_get_logits_ith(ctx.ptr, row)
                        logits[k] = np.ctypeslib.as_array(ptr, shape=(model.n_vocab,))
                    targets = seq[split + 1:out_end + 1]
                    nll_sum += float(token_nll(logits, targets).sum())
                    n_scored += len(targets)
            n_decoded += len(seq)
            if progress is not None:
                progress(n_scored, total)
    finally:
        batch.free()
    if n_scored != total:  # the arithmetic above and plan_windows disagree: a bug, not bad input
        raise AssertionError(f"scored {n_scored} tokens, planned {total}")
    mean = nll_sum / n_scored
    return PerplexityResult(model=Path(model.path).name, n_tokens=len(tokens), n_scored=n_scored,
                            n_windows=len(windows), n_decoded=n_decoded, n_ctx=n_ctx, stride=stride,
                            mean_nll=mean, ppl=math.exp(mean), eval_s=timer() - t0)
