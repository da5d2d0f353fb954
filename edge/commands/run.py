"""`edge run MODEL "prompt"`: one generation in-process (no server), streamed to stdout.

With `--tools FILE.json` the model is shown the tools; the calls it makes print as they decode
(`[tool call] NAME ARGUMENTS`), nothing runs them."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from edge.commands._common import add_settings_args, settings_from_args
from edge.commands._tools import load_tools, print_events, scanner_for
from edge.errors import InvalidRequest, TemplateError
from edge.runtime.types import EngineLike, FinishReason, GenerationRequest, SamplingParams
from edge.toolcalls import CallScanner


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
    p.add_argument("--chat-template", default=None,
                   help="replace the model's template: chatml, chatml-tools, llama3, plain or a file")
    p.add_argument("--tools", type=Path, default=None,
                   help="JSON file with a list of OpenAI tools; the calls the model makes are printed")
    add_settings_args(p)
    p.set_defaults(func=run)


def build_request(engine: EngineLike, prompt: str, args: argparse.Namespace,
                  tools: list[dict[str, Any]] | None = None) -> GenerationRequest:
    """Chat-template the prompt when the model has a template (and --raw is not given); `tools`
    need the template (no fallback to a plain completion)."""
    sampling = SamplingParams()
    if args.temperature is not None or args.seed is not None:
        from dataclasses import replace

        sampling = replace(
            sampling,
            **{k: v for k, v in (("temperature", args.temperature), ("seed", args.seed)) if v is not None},
        )
    # Base models (no template in the GGUF) get the prompt as is, as a completion.
    if not args.raw and engine.has_chat_template:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        messages.append({"role": "user", "content": prompt})
        try:
            text = engine.render_chat(messages, tools=tools) if tools else engine.render_chat(messages)
            return GenerationRequest(
                prompt=text, max_tokens=args.max_tokens, sampling=sampling, add_bos=False
            )
        except TemplateError:
            if tools:
                raise
            # base model: plain completion
    return GenerationRequest(prompt=prompt, max_tokens=args.max_tokens, sampling=sampling)


def generate(engine: EngineLike, req: GenerationRequest, out: TextIO, err: TextIO, stats: bool,
             scanner: CallScanner | None = None) -> int:
    """Stream the output to `out`; with a `scanner`, tool calls print as `[tool call] NAME ARGS`."""
    t0 = time.perf_counter()
    first = None
    handle = engine.submit(req)
    final = None
    for ev in handle:
        if ev.text and scanner is not None:
            print_events(scanner.feed(ev.text), out)
        elif ev.text:
            out.write(ev.text)
            out.flush()
        if ev.n_tokens and first is None:
            first = time.perf_counter()
        if ev.finish_reason is not None:
            final = ev
    if scanner is not None:
        print_events(scanner.finish(), out)
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

    settings = settings_from_args(args, n_ctx=args.ctx, threads=args.threads, slots=1,
                                  chat_template=args.chat_template)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    tools = load_tools(args.tools) if args.tools is not None else None
    if tools and args.raw:
        raise InvalidRequest("--tools needs the chat template (drop --raw)", "--tools")
    choice = choose_model(args.model, settings)
    engine, _ = open_engine(choice.path, settings)
    try:
        start_and_wait(engine)
        scanner = scanner_for(engine, tools) if tools else None
        req = build_request(engine, prompt, args, tools)
        return generate(engine, req, sys.stdout, sys.stderr, args.stats, scanner)
    finally:
        engine.stop(0.0)
