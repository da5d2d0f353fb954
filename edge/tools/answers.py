"""Did this quantization change the answers? Greedy answers of two models to the same prompts.

Perplexity says how well a model predicts a text on average; it can barely move while a few
answers change completely, so `edge eval --prompts` also answers each prompt greedily (argmax
at every step, the same computation for both models, so a model compared with itself agrees
exactly) and compares the token sequences: exact-match rate, and agreement, the share of tokens
before the first difference (common prefix / the longer answer), mean and worst.

The comparison is pure (tested without a model); `greedy_answers()` drives llama.cpp through
`edge.runtime.llama` as `perplexity.evaluate` does, rendering each prompt with the model's own
chat template.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edge.errors import InvalidRequest

DEFAULT_MAX_TOKENS = 48
MAX_BATCH = 512
CHANGED_SHOWN = 5  # prompts listed as "changed most"


@dataclass(frozen=True)
class Prompt:
    id: str
    messages: list[dict[str, Any]]
    max_tokens: int


@dataclass(frozen=True)
class Answer:
    tokens: tuple[int, ...]
    text: str


def load_prompts(path: Path, max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Prompt]:
    """JSON lines: {"id"?, "prompt": str} or {"id"?, "messages": [...]}, "max_tokens"? optional.
    InvalidRequest (param "prompts") names the first bad line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read --prompts {path}: {exc}", "prompts") from exc
    out: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            messages = obj["messages"] if "messages" in obj else [{"role": "user", "content": obj["prompt"]}]
            limit = int(obj.get("max_tokens", max_tokens))
            ok = isinstance(messages, list) and messages and limit >= 1
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise InvalidRequest(f"--prompts {path} line {n}: expected {{\"prompt\": ...}} or "
                                 "{\"messages\": [...]}, with max_tokens >= 1 if given", "prompts")
        out.append(Prompt(str(obj.get("id", n)), messages, limit))
    if not out:
        raise InvalidRequest(f"--prompts {path} holds no prompts", "prompts")
    return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token that differs (the shorter length when one answer stops early);
    None when the answers are equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def agreement(a: Sequence[int], b: Sequence[int]) -> float:
    """Tokens before the first difference over the longer answer: 1.0 only when equal, and an
    answer that stops early (or goes on) agrees only as far as the shorter one."""
    first = first_difference(a, b)
    return 1.0 if first is None else first / max(len(a), len(b))


@dataclass(frozen=True)
class Changed:
    id: str
    agreement: float
    first_difference: int | None  # token index, None when equal
    a: str
    b: str


def compare(prompts: Sequence[Prompt], a: Sequence[Answer], b: Sequence[Answer]) -> dict[str, Any]:
    """The figures `edge eval --prompts` reports (JSON-ready)."""
    rows = []
    for p, x, y in zip(prompts, a, b, strict=True):
        rows.append(Changed(p.id, agreement(x.tokens, y.tokens), first_difference(x.tokens, y.tokens),
                            x.text, y.text))
    worst = sorted((r for r in rows if r.first_difference is not None), key=lambda r: (r.agreement, r.id))
    n = len(rows)
    return {
        "n_prompts": n,
        "exact_match_rate": sum(r.first_difference is None for r in rows) / n,
        "agreement_mean": sum(r.agreement for r in rows) / n,
        "agreement_worst": min(r.agreement for r in rows),
        "changed_most": [asdict(r) for r in worst[:CHANGED_SHOWN]],
        "per_prompt": {r.id: r.agreement for r in rows},
    }


def greedy_answers(path: str | Path, prompts: Sequence[Prompt], *, n_threads: int, n_gpu_layers: int = 0,
                   progress: Callable[[int, int], None] | None = None) -> list[Answer]:
    """Each prompt's greedy answer from the model at `path` (validated and planned by the caller):
    its chat template, then argmax until an end-of-generation token or the prompt's max_tokens.
    Raises InvalidRequest (a prompt longer than the model's context), ModelLoadError, DecodeFailed."""
    from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
    from edge.runtime.text.chat_template import load_template

    model = LlamaModel(path, n_gpu_layers=n_gpu_layers)
    try:
        bos = model.token_text(model.bos_id)
        template = load_template(model.chat_template(), bos, model.token_text(model.eos_id))
        inputs = []
        for p in prompts:
            text = template.render(p.messages, add_generation_prompt=True)
            if model.add_bos and bos and not text.startswith(bos):
                text = bos + text  # as Engine.render_chat: BOS exactly where the model wants it
            inputs.append(model.tokenize(text, add_bos=False, parse_special=True))
        need = max(len(t) + p.max_tokens for t, p in zip(inputs, prompts, strict=True))
        if need > model.n_ctx_train:
            raise InvalidRequest(f"a prompt and its answer need {need} tokens; {Path(path).name} "
                                 f"has a context of {model.n_ctx_train}", "prompts")
        n_ctx = min(model.n_ctx_train, -(-need // 256) * 256)
        ctx = LlamaContext(model, ContextConfig(n_ctx=n_ctx, n_batch=min(MAX_BATCH, n_ctx),
                                                n_ubatch=min(MAX_BATCH, n_ctx), n_seq_max=1,
                                                n_threads=n_threads, n_outputs_max=1))
        try:
            out = []
            for i, (tokens, p) in enumerate(zip(inputs, prompts, strict=True)):
                out.append(_answer(model, ctx, tokens, p.max_tokens))
                if progress is not None:
                    progress(i + 1, len(prompts))
            return out
        finally:
            ctx.close()
    finally:
        model.close()


def _answer(model: Any, ctx: Any, prompt: list[int], max_tokens: int) -> Answer:
    import numpy as np

    from edge.errors import DecodeFailed
    from edge.runtime.llama import llama_cpp
    from edge.runtime.llama.batch import Batch

    batch = Batch(ctx.n_batch)
    ctx.clear()
    out: list[int] = []
    try:
        for c0 in range(0, len(prompt), ctx.n_batch):
            batch.clear()
            chunk = prompt[c0:c0 + ctx.n_batch]
            batch.add_prompt(0, chunk, c0, logits_last=c0 + len(chunk) == len(prompt))
            if (rc := batch.decode(ctx.ptr)) != 0:
                raise DecodeFailed(rc, "greedy answer: prompt")
        pos = len(prompt)
        while len(out) < max_tokens:
            row = llama_cpp.llama_get_logits_ith(ctx.ptr, -1)
            logits = np.ctypeslib.as_array(row, shape=(model.n_vocab,))
            token = int(logits.argmax())  # ties: the lowest id, the same for both models
            if model.is_eog(token):
                break
            out.append(token)
            batch.clear()
            batch.add_token(0, token, pos)
            if (rc := batch.decode(ctx.ptr)) != 0:
                raise DecodeFailed(rc, "greedy answer: token")
            pos += 1
    finally:
        batch.free()
    return Answer(tuple(out), model.detokenize(out))

