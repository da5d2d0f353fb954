"""The baseline of `edge bench engine`: a plain llama_decode loop, run as its own process.

This file imports nothing from edge: `edge bench engine` runs it by path
(`python bare_loop.py ...`) in a child process whose environment is the user's,
as it was before edge touched it, so it measures what a user would get from
llama.cpp with its defaults, not edge's process or settings.

It loads the model with llama.cpp's default parameters (n_ctx 2048; extra CPU
buffer types off only when asked, see --no-extra-buffers), evaluates the prompt
once per sequence, then decodes `--tokens` steps of one token per sequence in one
batch with a greedy sampler that bans end-of-generation tokens, and prints one
JSON line: {"tok_s": aggregate decode tokens/s, ...}.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
import time

import llama_cpp


def _quiet(level: int, text: bytes, user: ctypes.c_void_p) -> None:
    return None


_LOG = llama_cpp.llama_log_callback(_quiet)  # a reference C keeps; llama.cpp's log stays off stdout


def run(model_path: str, n_tokens: int, n_threads: int, n_seqs: int, n_ctx: int, prompt: str,
        extra_buffers: bool) -> float:
    llama_cpp.llama_log_set(_LOG, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.use_extra_bufts = extra_buffers
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        raise SystemExit(f"cannot load {model_path}")
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx, cp.n_seq_max, cp.n_threads, cp.n_threads_batch = n_ctx, n_seqs, n_threads, n_threads
    ctx = llama_cpp.llama_init_from_model(model, cp)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    eog = [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)]
    bias = (llama_cpp.llama_logit_bias * len(eog))()
    for i, t in enumerate(eog):
        bias[i].token, bias[i].bias = t, -math.inf
    chains = []
    for _ in range(n_seqs):
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        ban = llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(eog), bias)
        llama_cpp.llama_sampler_chain_add(chain, ban)
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        chains.append(chain)
    raw = prompt.encode()
    buf = (llama_cpp.llama_token * (len(raw) + 8))()
    n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), True, False)
    toks = list(buf[:n])
    batch = llama_cpp.llama_batch_init(max(512, n * n_seqs), 0, 1)
    for s in range(n_seqs):
        for i, t in enumerate(toks):
            k = s * n + i
            batch.token[k], batch.pos[k], batch.n_seq_id[k] = t, i, 1
            batch.seq_id[k][0] = s
            batch.logits[k] = 1 if i == n - 1 else 0
    batch.n_tokens = n * n_seqs
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise SystemExit("prompt decode failed")
    nxt = [llama_cpp.llama_sampler_sample(chains[s], ctx, s * n + n - 1) for s in range(n_seqs)]
    batch.n_tokens = n_seqs
    for s in range(n_seqs):
        batch.logits[s], batch.seq_id[s][0], batch.n_seq_id[s] = 1, s, 1
    t0 = time.perf_counter()
    for i in range(n_tokens):
        for s in range(n_seqs):
            batch.token[s], batch.pos[s] = nxt[s], n + i
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("decode failed")
        nxt = [llama_cpp.llama_sampler_sample(chains[s], ctx, s) for s in range(n_seqs)]
    return n_tokens * n_seqs / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seqs", type=int, default=1)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--prompt", default="The history of the printing press begins")
    p.add_argument("--no-extra-buffers", action="store_true",
                   help="keep weights off ggml's extra CPU buffer types (their AMX kernels crash)")
    a = p.parse_args(argv)
    tok_s = run(a.model, a.tokens, a.threads, a.seqs, a.ctx, a.prompt, not a.no_extra_buffers)
    print(json.dumps({"tok_s": tok_s, "threads": a.threads, "seqs": a.seqs, "tokens": a.tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
