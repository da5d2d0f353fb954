"""`edge chat [MODEL | --url URL]`: an interactive chat with history.

With `--url` it talks to a running server (streaming); otherwise it loads the
model in-process. `/reset` clears the history, `/exit` (or Ctrl-D) quits.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import TextIO

from edge.commands._common import add_settings_args, settings_from_args
from edge.runtime.types import EngineLike, FinishReason, GenerationRequest, SamplingParams

Reply = Callable[[list[dict[str, str]]], Iterator[str]]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="interactive chat (in-process, or against a server with --url)")
    p.add_argument("model", nargs="?", default=None, help="store name or .gguf path (in-process mode)")
    p.add_argument(
        "--url", default=None, help="chat with a running server instead, e.g. http://127.0.0.1:8088"
    )
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("-n", "--max-tokens", type=int, default=512, help="tokens per reply at most")
    p.add_argument("--temperature", type=float, default=None, help="0 is greedy")
    p.add_argument("--ctx", type=int, default=None, help="context length (in-process mode)")
    add_settings_args(p)
    p.set_defaults(func=run)


def repl(reply: Reply, system: str | None, inp: TextIO, out: TextIO, prompt: str = ">>> ") -> int:
    """Read lines, keep the history, stream each reply. Returns the number of turns."""
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    turns = 0
    while True:
        out.write(prompt)
        out.flush()
        line = inp.readline()
        if not line:
            out.write("\n")
            return turns
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit", "/bye"):
            return turns
        if text == "/reset":
            history = history[:1] if system else []
            out.write("(history cleared)\n")
            continue
        history.append({"role": "user", "content": text})
        parts: list[str] = []
        try:
            for piece in reply(history):
                parts.append(piece)
                out.write(piece)
                out.flush()
        except KeyboardInterrupt:
            out.write(" [interrupted]")
        out.write("\n")
        history.append({"role": "assistant", "content": "".join(parts)})
        turns += 1


def engine_reply(engine: EngineLike, max_tokens: int, sampling: SamplingParams) -> Reply:
    def reply(history: list[dict[str, str]]) -> Iterator[str]:
        text = engine.render_chat(history)
        handle = engine.submit(
            GenerationRequest(prompt=text, max_tokens=max_tokens, sampling=sampling, add_bos=False)
        )
        for ev in handle:  # leaving early (Ctrl-C) cancels the request
            if ev.finish_reason is FinishReason.ERROR and ev.error is not None:
                raise ev.error
            if ev.text:
                yield ev.text

    return reply


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, n_ctx=args.ctx, slots=1 if not args.url else None)
    params = {"max_tokens": args.max_tokens}
    if args.temperature is not None:
        params["temperature"] = args.temperature
    if args.url:
        from edge.service.client import ApiClient

        client = ApiClient(args.url, settings.resolved_api_key())
        model = args.model or client.model_id()
        repl(lambda h: client.stream_chat(h, model, **params), args.system, sys.stdin, sys.stdout)
        return 0
    from dataclasses import replace

    from edge.service.launch import choose_model, open_engine, start_and_wait

    choice = choose_model(args.model, settings)
    engine = open_engine(choice.path, settings)
    sampling = (
        SamplingParams()
        if args.temperature is None
        else replace(SamplingParams(), temperature=args.temperature)
    )
    try:
        start_and_wait(engine)
        repl(engine_reply(engine, args.max_tokens, sampling), args.system, sys.stdin, sys.stdout)
    finally:
        engine.stop(0.0)
    return 0
