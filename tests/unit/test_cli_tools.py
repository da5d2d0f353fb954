"""`edge run/chat --tools` without a model: tool files, the calls printed as they decode, and the
chat REPL sending a typed result back to the model."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from edge.commands import chat, run
from edge.commands._tools import load_tools, scanner_for
from edge.errors import InvalidRequest
from edge.runtime.text.chat_template import TemplateInfo
from edge.runtime.types import GenerationRequest, SamplingParams
from tests.fakes import ScriptedEngine

HERMES = TemplateInfo("model", None, tools=True, tool_format="hermes")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [{"type": "function",
          "function": {"name": "get_weather", "description": "Weather", "parameters": CITY}}]


def engine_saying(*outputs: str) -> ScriptedEngine:
    said = list(outputs)

    def script(_: GenerationRequest) -> list[str]:
        text = said.pop(0) if len(said) > 1 else said[0]
        return [text[i:i + 4] for i in range(0, len(text), 4)]

    engine = ScriptedEngine(script=script, template_info=HERMES, n_ctx=512)
    engine.start()
    return engine


def test_load_tools_reads_chat_and_flat_shapes_and_refuses_bad_files(tmp_path: Path) -> None:
    f = tmp_path / "tools.json"
    f.write_text(json.dumps(TOOLS))
    assert load_tools(f) == TOOLS
    f.write_text(json.dumps({"tools": [{"type": "function", "name": "add"}]}))
    assert load_tools(f) == [{"type": "function",
                              "function": {"name": "add", "parameters": {"type": "object"}}}]
    for bad in ("not json", "[]", '[{"type": "web_search"}]', '[{"function": {"name": "has space"}}]'):
        f.write_text(bad)
        with pytest.raises(InvalidRequest):
            load_tools(f)


def test_run_prints_the_call_as_it_decodes() -> None:
    engine = engine_saying("Sure.\n" + CALL)
    args = argparse.Namespace(raw=False, system=None, max_tokens=64, temperature=None, seed=None)
    req = run.build_request(engine, "weather in Paris?", args, TOOLS)
    assert engine.rendered[-1][1] == TOOLS  # the template was shown the tools
    out = io.StringIO()
    assert run.generate(engine, req, out, io.StringIO(), False, scanner_for(engine, TOOLS)) == 0
    assert out.getvalue() == 'Sure.\n[tool call] get_weather {"city": "Paris"}\n\n'


def test_tools_need_a_template_that_shows_them() -> None:
    engine = ScriptedEngine(template_info=TemplateInfo("model", None, tools=False, tool_format=None))
    engine.start()
    with pytest.raises(InvalidRequest, match="chatml-tools"):
        scanner_for(engine, TOOLS)


def test_chat_repl_asks_for_each_result_and_the_model_answers_with_it() -> None:
    engine = engine_saying(CALL, "It is 21 degrees.", "Bye.")
    turn = chat.Turn()
    reply = chat.engine_reply(engine, 64, SamplingParams(), TOOLS, turn)
    inp, out = io.StringIO('weather?\n{"temp_c": 21}\nthanks\n'), io.StringIO()
    assert chat.repl(reply, None, inp, out, turn=turn) == 2
    text = out.getvalue()
    assert '[tool call] get_weather {"city": "Paris"}' in text and "result get_weather> " in text
    assert "It is 21 degrees." in text and "Bye." in text
    assert len(engine.rendered) == 3  # call, answer with the result, next user turn
    history, _ = engine.rendered[2]  # (the REPL's one history list, as the last generation saw it)
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert history[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert history[2]["content"] == '{"temp_c": 21}' and history[2]["name"] == "get_weather"
    assert history[2]["tool_call_id"] == history[1]["tool_calls"][0]["id"]
    assert history[3]["content"] == "It is 21 degrees." and "tool_calls" not in history[3]


def test_tool_parsing_for_the_cli_loads_no_http_layer() -> None:
    """runtime and the CLI's tool support must not pull in edge.api (FastAPI) for parsing calls."""
    import subprocess
    import sys

    code = ("import sys, edge.toolcalls, edge.commands.run, edge.commands.chat; "
            "bad = sorted(m for m in sys.modules if m.startswith(('edge.api', 'fastapi'))); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
