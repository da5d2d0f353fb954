"""`edge chat [MODEL | --url URL]`: an interactive chat with history.

With `--url` it talks to a running server (streaming); otherwise it loads the
model in-process. `/reset` clears the history, `/exit` (or Ctrl-D) quits.

In-process, `--tools FILE.json` shows the model the tools; each call it makes prints as it
decodes (`[tool call] NAME ARGUMENTS`) and the REPL asks for its result (`result NAME> `): the
line typed is sent back as the tool's output and the model answers again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from edge.commands._common import add_settings_args, settings_from_args
from edge.commands._tools import assistant_turn, load_tools, print_events, scanner_for
from edge.errors import InvalidRequest
from edge.runtime.types import EngineLike, FinishReason, GenerationRequest, SamplingParams
from edge.toolcalls import ParsedCall

Reply = Callable[[list[dict[str, Any]]], Iterator[str]]


@dataclass
class Turn:
    """What a tool-aware reply produced besides its printed text: content and calls."""

    content: str = ""
    calls: list[ParsedCall] = field(default_factory=list)


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
    p.add_argument("--chat-template", default=None,
                   help="the template to use (in-process): chatml, chatml-tools, llama3, plain, FILE")
    p.add_argument("--tools", type=Path, default=None,
                   help="JSON list of OpenAI tools (in-process): calls are printed, you type each result")
    add_settings_args(p)
    p.set_defaults(func=run)


def repl(reply: Reply, system: str | None, inp: TextIO, out: TextIO, prompt: str = ">>> ",
         turn: Turn | None = None) -> int:
    """Read lines, keep the history, stream each reply. Returns the number of turns. With `turn`
    (filled by a tool-aware reply), calls are answered by lines the user types, then the model
    goes on."""
    history: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
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
        while True:
            parts: list[str] = []
            try:
                for piece in reply(history):
                    parts.append(piece)
                    out.write(piece)
                    out.flush()
            except KeyboardInterrupt:
                out.write(" [interrupted]")
            out.write("\n")
            if turn is None or not turn.calls:
                history.append({"role": "assistant", "content": turn.content if turn else "".join(parts)})
                break
            history.append(assistant_turn(turn.content, turn.calls))
            for call in turn.calls:
                out.write(f"result {call.name}> ")
                out.flush()
                result = inp.readline()
                if not result:
                    out.write("\n")
                    return turns + 1
                history.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                                "content": result.rstrip("\n")})
        turns += 1


def engine_reply(engine: EngineLike, max_tokens: int, sampling: SamplingParams,
                 tools: list[dict[str, Any]] | None = None, turn: Turn | None = None) -> Reply:
    """Replies from an in-process engine; with `tools`, calls print as they decode and land in `turn`."""

    def reply(history: list[dict[str, Any]]) -> Iterator[str]:
        text = engine.render_chat(history, tools=tools) if tools else engine.render_chat(history)
        handle = engine.submit(
            GenerationRequest(prompt=text, max_tokens=max_tokens, sampling=sampling, add_bos=False)
        )
        scanner = scanner_for(engine, tools) if tools else None
        if turn is not None:
            turn.content, turn.calls = "", []
        for ev in handle:  # leaving early (Ctrl-C) cancels the request
            if ev.finish_reason is FinishReason.ERROR and ev.error is not None:
                raise ev.error
            if ev.text and scanner is None:
                yield ev.text
            elif ev.text:
                yield from _shown(scanner.feed(ev.text), turn)
        if scanner is not None:
            yield from _shown(scanner.finish(), turn)
            if turn is not None:
                turn.calls = list(scanner.calls)

    return reply


def _shown(events: list[tuple[str, Any]], turn: Turn | None) -> Iterator[str]:
    """The printed form of scanner events (see `print_events`); content is kept in `turn`."""
    buf = _Buffer()
    print_events(events, buf)
    if turn is not None:
        turn.content += "".join(v for k, v in events if k == "content")
    if buf.text:
        yield buf.text


class _Buffer:
    """A minimal TextIO for `print_events`."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, n_ctx=args.ctx, slots=1 if not args.url else None,
                                  chat_template=None if args.url else args.chat_template)
    params = {"max_tokens": args.max_tokens}
    if args.temperature is not None:
        params["temperature"] = args.temperature
    if args.url and (args.tools or args.chat_template):
        raise InvalidRequest("--tools and --chat-template work in-process only (not with --url)", "--tools")
    tools = load_tools(args.tools) if args.tools is not None else None
    if args.url:
        from edge.service.client import ApiClient

        client = ApiClient(args.url, settings.resolved_api_key())
        model = args.model or client.model_id()
        repl(lambda h: client.stream_chat(h, model, **params), args.system, sys.stdin, sys.stdout)
        return 0
    from dataclasses import replace

    from edge.service.launch import choose_model, open_engine, start_and_wait

    choice = choose_model(args.model, settings)
    engine, _ = open_engine(choice.path, settings)
    sampling = (
        SamplingParams()
        if args.temperature is None
        else replace(SamplingParams(), temperature=args.temperature)
    )
    try:
        start_and_wait(engine)
        turn = Turn() if tools else None
        if tools:
            scanner_for(engine, tools)  # the template must show tools: say so before the first prompt
        repl(engine_reply(engine, args.max_tokens, sampling, tools, turn), args.system, sys.stdin, sys.stdout,
             turn=turn)
    finally:
        engine.stop(0.0)
    return 0
