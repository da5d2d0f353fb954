"""`edge run MODEL "prompt"`: one generation in-process (no server), streamed to stdout."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from edge.commands._common import add_settings_args, settings_from_args
from edge.errors import TemplateError
from edge.runtime.types import EngineLike, FinishReason, GenerationRequest, SamplingParams


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="generate once in-process and print the output")
    p.add_argument("model", help="store name or .gguf path")
    p.add_argument("prompt", nargs="?", default=None, help="prompt text (default: read stdin)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--system", default=None, help="system message (chat template only)")
    p.add_argument("-n", "--max-tokens", type=int, default=256, help="tokens to generate at most")
    p.add_argument("--temperature", type=float, default=None, help="0 is greedy")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--ctx", type=int, default=None, help="context length in tokens")
    p.add_argument("--threads", type=int, default=None, help="decode threads")
    p.add_argument("--stats", action="store_true", help="print token counts and speed to stderr")
    add_settings_args(p)
    p.set_defaults(func=run)


def build_request(engine: EngineLike, prompt: str, args: argparse.Namespace) -> GenerationRequest:
    """Chat-template the prompt when the model has a template (and --raw is not given)."""
    sampling = SamplingParams()
    if args.temperature is not None or args.seed is not None:
        from dataclasses import replace

        sampling = replace(
            sampling,
            **{k: v for k, v in (("temperature", args.temperature), ("seed", args.seed)) if v is not None},
        )
    # Base models (no template in the GGUF) get the prompt as is, as a completion.
    if not args.raw and getattr(engine, "has_chat_template", True):
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": prompt})
        try:
            text = engine.render_chat(messages)
            return GenerationRequest(
                prompt=text, max_tokens=args.max_tokens, sampling=sampling, add_bos=False
            )
        except TemplateError:
            pass  # base model: plain completion
    return GenerationRequest(prompt=prompt, max_tokens=args.max_tokens, sampling=sampling)


def generate(engine: EngineLike, req: GenerationRequest, out: TextIO, err: TextIO, stats: bool) -> int:
    t0 = time.perf_counter()
    first = None
    handle = engine.submit(req)
    final = None
    for ev in handle:
        if ev.text:
            out.write(ev.text)
            out.flush()
        if ev.n_tokens and first is None:
            first = time.perf_counter()
        if ev.finish_reason is not None:
            final = ev
    out.write("\n")
    if final is not None and final.finish_reason is FinishReason.ERROR and final.error is not None:
        raise final.error
    if stats and final is not None and final.usage is not None:
        dt = time.perf_counter() - (first or t0)
        n = final.usage.completion_tokens
        err.write(
            f"{final.usage.prompt_tokens} prompt tokens, {n} generated, "
            f"first token {((first or t0) - t0) * 1000:.0f} ms, "
            f"{(n - 1) / dt if n > 1 and dt > 0 else 0:.1f} tokens/s, finish {final.finish_reason.value}\n"
        )
    return 0


def run(args: argparse.Namespace) -> int:
    from edge.service.launch import choose_model, open_engine, start_and_wait

    settings = settings_from_args(args, n_ctx=args.ctx, threads=args.threads, slots=1)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    choice = choose_model(args.model, settings)
    engine = open_engine(choice.path, settings)
    try:
        start_and_wait(engine)
        return generate(engine, build_request(engine, prompt, args), sys.stdout, sys.stderr, args.stats)
    finally:
        engine.stop(0.0)
