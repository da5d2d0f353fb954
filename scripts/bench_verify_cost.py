"""What a speculative verify step costs on this machine: seconds of one llama_decode of one
sequence's n tokens (its pending token and n-1 drafted ones, logits on every row) against a
one-token step, at a fixed KV depth (the tokens are removed again after each step).

    .venv/bin/python scripts/bench_verify_cost.py MODEL.gguf [--threads N] [--depth D] [--max-n K]

The break-even of speculation follows: with acceptance a per drafted token, a d-token draft
emits (1 - a^(d+1)) / (1 - a) tokens for cost(d+1) / cost(1) one-token steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from edge.runtime.llama import attention
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--depth", type=int, default=300, help="KV cells before the measured step")
    ap.add_argument("--max-n", type=int, default=9)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto")
    args = ap.parse_args()
    model = LlamaModel(args.model)
    ctx = LlamaContext(model, ContextConfig(n_ctx=args.ctx, n_seq_max=1, n_threads=args.threads,
                                            n_outputs_max=args.max_n,
                                            flash_attn=attention.fixed_choice(args.flash_attn)))
    ctx.warm_up(model)
    batch = Batch(max(args.depth, args.max_n))
    prompt = [(i * 7919) % (model.n_vocab - 10) + 5 for i in range(args.depth)]
    batch.add_prompt(0, prompt, 0, logits_last=True)
    assert batch.decode(ctx.ptr) == 0
    base: float | None = None
    print(f"threads={args.threads} depth={args.depth} n_ctx={args.ctx}")
    for n in range(1, args.max_n + 1):
        times = []
        for _ in range(args.reps):
            batch.clear()
            batch.add_tokens(0, prompt[:n], args.depth)
            t0 = time.perf_counter()
            assert batch.decode(ctx.ptr) == 0
            import llama_cpp

            llama_cpp.llama_synchronize(ctx.ptr)
            times.append(time.perf_counter() - t0)
            ctx.seq_rm(0, args.depth, -1)
        med = statistics.median(times)
        base = base or med
        print(f"n={n}  {med * 1e3:7.2f} ms  x{med / base:5.2f} of a 1-token step  "
              f"({n / (med / base):4.2f} tokens per 1-token-step time at full acceptance)")
    batch.free()
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
