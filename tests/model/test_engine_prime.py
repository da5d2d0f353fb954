"""The chat template's head primed into a real SmolLM2 context (runtime/llama/prime.py): what the
rest of a chat then computes is what the whole prompt computes, the warm-up keeps it, and a
stop ends the priming after one chunk."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from edge.runtime.llama import llama_cpp
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.llama.prime import CHUNK_TOKENS, chat_head, prime
from edge.runtime.llama.sampling import logits_row
from edge.runtime.text.chat_template import ChatTemplate, load_template

pytestmark = pytest.mark.model

CFG = ContextConfig(n_ctx=1024, n_seq_max=2, n_threads=2)


def _logits(model: LlamaModel, ctx: LlamaContext, tokens: list[int], pos0: int) -> np.ndarray:
    batch = Batch(len(tokens))
    try:
        row = batch.add_prompt(0, tokens, pos0, logits_last=True)
        assert batch.decode(ctx.ptr) == 0
        return logits_row(ctx.ptr, row, model.n_vocab).copy()
    finally:
        batch.free()


def _template(model: LlamaModel) -> ChatTemplate:
    bos, eos = model.token_text(model.bos_id), model.token_text(model.eos_id)
    return load_template(model.chat_template(), bos, eos)


def test_a_chat_after_its_primed_head_computes_what_the_whole_prompt_does(smollm2_path: Path) -> None:
    model = LlamaModel(str(smollm2_path), n_gpu_layers=0)
    template = _template(model)
    head = chat_head(template, model)
    prompt = model.tokenize(template.prompt([{"role": "user", "content": "Say hi."}], model.add_bos),
                            add_bos=False)
    assert len(head) >= 16 and tuple(prompt[:len(head)]) == head  # SmolLM2's default system prompt
    primed, whole = LlamaContext(model, CFG), LlamaContext(model, CFG)
    try:
        got = threading.Thread(target=prime, args=(primed, head))  # as the early thread does it
        got.start()
        got.join()
        assert primed.primed == head
        assert llama_cpp.llama_n_threads(primed.ptr) == 2  # its own threads again
        primed.warm_up(model)  # nothing: the priming warmed the context
        assert primed.primed == head and primed.seq_pos_max(0) == len(head) - 1
        rest = _logits(model, primed, prompt[len(head):], len(head))
        full = _logits(model, whole, prompt, 0)
        assert int(rest.argmax()) == int(full.argmax())
        assert float(np.abs(rest - full).max()) < 0.05  # one thread and small chunks vs one batch
    finally:
        primed.close()
        whole.close()
        model.close()


def test_a_stop_ends_the_priming_after_its_first_chunk(smollm2_path: Path) -> None:
    model = LlamaModel(str(smollm2_path), n_gpu_layers=0)
    template = _template(model)
    head = chat_head(template, model)
    ctx = LlamaContext(model, CFG)
    try:
        stop = threading.Event()
        stop.set()
        assert prime(ctx, head, stop) == head[:CHUNK_TOKENS]
        assert ctx.seq_pos_max(0) == CHUNK_TOKENS - 1
        ctx.clear()
        assert ctx.primed == () and ctx.seq_pos_max(0) == -1
        assert prime(ctx, head, stop, first_chunk=False) == ()  # a first start's, once serve hurried
        assert ctx.seq_pos_max(0) == -1
        stop.clear()
        assert prime(ctx, head, stop, first_chunk=False) == head and ctx.seq_pos_max(0) == len(head) - 1
    finally:
        ctx.close()
        model.close()


def test_the_engine_may_take_the_context_while_another_thread_primes_it(smollm2_path: Path) -> None:
    """As early.py hands it over: held, primed on another thread, released; the warm-up waits."""
    model = LlamaModel(str(smollm2_path), n_gpu_layers=0)
    head = chat_head(_template(model), model)
    ctx = LlamaContext(model, CFG)
    try:
        ctx.hold()

        def primer() -> None:
            try:
                prime(ctx, head)
            finally:
                ctx.release()

        thread = threading.Thread(target=primer)
        thread.start()
        ctx.warm_up(model)  # waits for the priming (and then decodes nothing after it)
        thread.join()
        assert ctx.primed == head and ctx.seq_pos_max(0) == len(head) - 1
    finally:
        ctx.close()
        model.close()


def test_a_primed_context_is_not_warmed_up_again(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The priming's decodes ran every layer: a warm-up after them only delayed `ready`."""
    decodes: list[int] = []
    real = Batch.decode

    def counting(self: Batch, ctx_ptr: object) -> int:
        decodes.append(self.n)
        return real(self, ctx_ptr)

    monkeypatch.setattr(Batch, "decode", counting)
    model = LlamaModel(str(smollm2_path), n_gpu_layers=0)
    head = chat_head(_template(model), model)
    primed, cold = LlamaContext(model, CFG), LlamaContext(model, CFG)
    try:
        prime(primed, head)
        decodes.clear()
        primed.warm_up(model)
        assert decodes == [] and primed.seq_pos_max(0) == len(head) - 1
        cold.warm_up(model)
        assert len(decodes) == 1 and cold.seq_pos_max(0) == -1  # decoded once, then forgotten
    finally:
        primed.close()
        cold.close()
        model.close()
