"""The chat template's head, evaluated into sequence 0 while the start's Python still imports.

Every chat rendered with a model's own template begins with the same tokens when the client
sends no system message: SmolLM2's and Qwen2.5's templates write a default system prompt, 24
of the 33 tokens of a short first question. Their evaluation is most of a first request's
prompt time (a prompt batch costs ~5 ms a token on a 2-core Xeon with the weights mapped, not
repacked). A start whose weights load early (early.py) reads these tokens from the last start's
record, and right after the early context is made decodes them into sequence 0 with one thread,
on the core that the start's imports leave idle. The engine thread then takes them as slot 0's
prompt cache (engine/startup.py), so the first chat reuses them as it reuses any cached prefix.

Only the template's own text is recorded, never what a client sent. One thread means no OpenMP
team on the early thread (ggml runs a one-thread graph in the calling thread), so the engine
thread's decodes keep their own team (kv/residency.py). `stop` ends the work after a chunk:
serve sets it when the API is imported, so a slow decode never delays `ready` by more than a
chunk of `CHUNK_TOKENS`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from edge.runtime.llama import llama_cpp
from edge.runtime.step.slots import common_prefix_len  # the rule a prompt's cache reuse follows

if TYPE_CHECKING:
    from edge.runtime.llama.model import LlamaContext, LlamaModel
    from edge.runtime.text.chat_template import ChatTemplate

log = logging.getLogger("edge.engine")

HEAD_MAX_TOKENS = 256  # a longer default system prompt is primed up to here
MIN_HEAD_TOKENS = 4  # fewer (a bare turn marker) are not worth a decode
# tokens per priming decode, so how long `stop` may wait. On one thread a prompt batch gains
# little from its size (SmolLM2, 2-core Xeon, the other core busy: 24 tokens in 190-320 ms as
# chunks of 24, 8 or 4), while the chunk running when serve hurries delays `ready`: 64-118 ms
# for 8 tokens, 37-57 ms for 4.
CHUNK_TOKENS = 4
# two first messages that share no first character: what they share is the template's
SAMPLES = ("Hello", "1 + 1 = ?")


def chat_head(template: ChatTemplate, model: LlamaModel) -> tuple[int, ...]:
    """The tokens every chat of one user message starts with under `template`, as a chat request
    tokenizes them (engine render_chat: the prompt text, no BOS added); () for the plain fallback
    of a model without a template, a head under MIN_HEAD_TOKENS, or a template that fails."""
    if template.is_fallback:
        return ()
    try:
        a, b = (model.tokenize(template.prompt([{"role": "user", "content": s}], model.add_bos),
                               add_bos=False) for s in SAMPLES)
    except Exception as exc:  # an odd template: no head start, the chats report what fails
        log.debug("no chat head: %s", exc)
        return ()
    n = min(common_prefix_len(a, b), HEAD_MAX_TOKENS)
    return tuple(a[:n]) if n >= MIN_HEAD_TOKENS else ()


def prime(ctx: LlamaContext, tokens: tuple[int, ...], stop: threading.Event | None = None,
          chunk: int = CHUNK_TOKENS, first_chunk: bool = True) -> tuple[int, ...]:
    """Decode `tokens` into sequence 0 of the fresh context `ctx` from position 0, one thread,
    `chunk` tokens a decode, until done or `stop` is set (checked after the first chunk, or
    before it too without `first_chunk`); `ctx.primed` says what it holds, which is also
    returned. A failed decode leaves the context empty. The context's threads are its own again
    afterwards."""
    from edge.runtime.llama.batch import Batch

    n_threads = llama_cpp.llama_n_threads(ctx.ptr)
    n_threads_batch = llama_cpp.llama_n_threads_batch(ctx.ptr)
    batch = Batch(max(1, min(chunk, ctx.n_batch)))
    done = 0
    llama_cpp.llama_set_n_threads(ctx.ptr, 1, 1)
    try:
        while done < len(tokens) and not ((done or not first_chunk) and stop is not None and stop.is_set()):
            part = tokens[done : done + batch.capacity]
            batch.clear()
            batch.add_prompt(0, part, done, logits_last=False)
            if batch.decode(ctx.ptr) != 0:
                ctx.clear()
                done = 0
                break
            done += len(part)
    finally:
        llama_cpp.llama_set_n_threads(ctx.ptr, n_threads, n_threads_batch)
        batch.free()
    ctx.primed = tuple(tokens[:done])
    return ctx.primed
