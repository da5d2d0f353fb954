"""Which chat template is in use: named and file templates, the fallback's turn markers as stop
strings, tool-format detection, and how /v1/models, `edge inspect` and settings report it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from edge.api.tools import JsonArgs
from edge.cli import main
from edge.config import load_settings
from edge.errors import ConfigError
from edge.host.loading import template_choice
from edge.runtime.text.chat_template import (
    NAMED_TEMPLATES,
    PLAIN_TEMPLATE,
    ChatTemplate,
    TemplateInfo,
    describe,
    load_template,
    resolve_chat_template,
    tool_format,
)
from tests.fakes import CHAT, ScriptedEngine, make_app
from tests.ggufgen import write_tiny_model

# The tool parts of real templates, as their GGUF files carry them (abridged).
QWEN25 = ("{%- if tools %}{{- '<|im_start|>system\\n' }}"
          "{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}"
          "{{- '<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}' }}"
          "{{- '\\n</tool_call>' }}"
          "{%- endif %}{%- for message in messages %}{%- if message.tool_calls %}"
          "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
          "{%- set tool_call = tool_call.function %}{%- endif %}"
          "{{- '<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
          "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
          "{%- else %}{{- message.content }}{%- endif %}{%- endfor %}")
LLAMA31 = ("{{- bos_token }}{%- if tools is not none %}{{- 'Environment: ipython' }}{%- endif %}"
           "{%- for message in messages %}"
           "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"
           "{{- message['content'] }}{{- '<|eot_id|>' }}{%- endfor %}")
MISTRAL = ("{%- if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
           "{%- for m in messages %}{%- if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}"
           "{%- else %}{{ m.content }}{%- endif %}{%- endfor %}")
SMOLLM2 = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
           "'<|im_end|>' + '\\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.mark.parametrize(
    ("source", "fmt"),
    [(QWEN25, "hermes"), (LLAMA31, "llama3"), (MISTRAL, "mistral"), (SMOLLM2, None), (PLAIN_TEMPLATE, None),
     ("{% if tools %}{{ tools | tojson }}{% endif %}{{ messages }}", "generic"),
     (NAMED_TEMPLATES["chatml-tools"].source, "hermes")],
)
def test_tool_format_is_detected_from_the_template_text(source: str, fmt: str | None) -> None:
    assert tool_format(source) == fmt


def test_tool_call_arguments_render_as_json_both_ways() -> None:
    msgs = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "add", "arguments": JsonArgs({"a": 1})}}]}]
    assert '{"name": "add", "arguments": {"a": 1}}' in ChatTemplate(QWEN25).render(msgs, False)
    plain = ChatTemplate("{% for c in messages[0].tool_calls %}{{ c.function.arguments }}{% endfor %}")
    assert plain.render(msgs, False) == '{"a": 1}'


def test_chatml_tools_template_renders_tools_calls_and_results() -> None:
    t = ChatTemplate(NAMED_TEMPLATES["chatml-tools"].source)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": JsonArgs({"a": 1})}}]},
        {"role": "tool", "content": "3", "tool_call_id": "c1"},
    ]
    out = t.render(msgs, tools=tools)
    assert out.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    tool_json = '{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}'
    assert f"<tools>\n{tool_json}\n</tools>" in out
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>\n" in out
    assert "<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n" in out
    assert out.endswith("<|im_start|>assistant\n")
    assert t.render(msgs[:2]) == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                                  "<|im_start|>user\n1+2?<|im_end|>\n<|im_start|>assistant\n")


def test_describe_model_fallback_named_and_file(tmp_path: Path) -> None:
    assert describe(ChatTemplate(QWEN25)) == TemplateInfo("model", None, True, "hermes", ())
    fb = describe(load_template(None))
    assert (fb.source, fb.name, fb.tools) == ("fallback", "plain", False)
    assert "\nUser:" in fb.stop  # the model must not write the user's next turn
    choice = resolve_chat_template("chatml-tools")
    named = describe(ChatTemplate(NAMED_TEMPLATES["chatml-tools"].source), choice)
    assert (named.source, named.name, named.tool_format) == ("name", "chatml-tools", "hermes")
    assert named.stop == ("<|im_end|>", "<|im_start|>")
    f = tmp_path / "t.jinja"
    f.write_text(SMOLLM2)
    choice = resolve_chat_template(str(f))
    assert choice is not None and choice.source == SMOLLM2
    info = describe(ChatTemplate(choice.source), choice)
    assert (info.source, info.name, info.stop) == ("file", str(f), ())


@pytest.mark.parametrize("value", ["chatml-tool", "/no/such/file.jinja"])
def test_unknown_name_or_missing_file_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="neither a built-in template"):
        resolve_chat_template(value)
    settings = load_settings(chat_template=value)  # the settings layer cannot check it (runtime's)
    with pytest.raises(ConfigError) as err:
        template_choice(settings)  # where engines are built, and every command reading settings
    assert err.value.field == "chat_template" and "chatml-tools" in str(err.value)


def test_file_that_does_not_compile_is_a_config_error(tmp_path: Path) -> None:
    f = tmp_path / "bad.jinja"
    f.write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="does not compile"):
        resolve_chat_template(str(f))
    f.write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(ConfigError, match="cannot read"):
        resolve_chat_template(str(f))


def test_fallback_turn_markers_become_stop_strings() -> None:
    info = describe(load_template(None))
    app, engine = make_app(ScriptedEngine(template_info=info))
    client = TestClient(app)
    assert client.post("/v1/chat/completions", json={**CHAT, "stop": ["END"]}).status_code == 200
    stop = engine.submitted[-1].stop
    assert stop[0] == "END" and set(info.stop) <= set(stop)
    assert client.post("/v1/completions", json={"model": "scripted-model", "prompt": "x"}).status_code == 200
    assert engine.submitted[-1].stop == ()  # raw completions get only what the client asks for
    model_info = describe(ChatTemplate(SMOLLM2))
    app, engine = make_app(ScriptedEngine(template_info=model_info))
    TestClient(app).post("/v1/chat/completions", json=CHAT)
    assert engine.submitted[-1].stop == ()


def test_models_endpoint_says_which_template() -> None:
    app, _ = make_app(ScriptedEngine(template_info=describe(load_template(None))))
    client = TestClient(app)
    card = client.get("/v1/models").json()["data"][0]
    assert card["chat_template"]["source"] == "fallback" and card["chat_template"]["name"] == "plain"
    assert client.get("/v1/models/scripted-model").json()["chat_template"]["tools"] is False
    app, _ = make_app(ScriptedEngine())  # an engine that cannot say (not loaded yet)
    assert TestClient(app).get("/v1/models").json()["data"][0]["chat_template"] is None


def _inspect(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_inspect_reports_the_template_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_tiny_model(tmp_path / "base.gguf")
    rc, out, _ = _inspect(capsys, str(base))
    assert rc == 0 and "template in use fallback 'plain' (the model has none)" in out and '"\\nUser:"' in out
    rc, out, _ = _inspect(capsys, str(base), "--json", "--chat-template", "chatml-tools")
    data = json.loads(out)
    assert data["chat_template"] is False
    assert data["chat_template_in_use"] == {"source": "name", "name": "chatml-tools", "tools": True,
                                            "tool_format": "hermes", "stop": ["<|im_end|>", "<|im_start|>"],
                                            "thinking": None}
    qwen = write_tiny_model(tmp_path / "qwen.gguf", chat_template=QWEN25)
    rc, out, _ = _inspect(capsys, str(qwen))
    assert "template in use model's own (tools: hermes)" in out
    rc, _, err = _inspect(capsys, str(qwen), "--chat-template", "nope")
    assert rc == 2 and "invalid setting chat_template" in err and len(err.strip().splitlines()) == 1
    broken = write_tiny_model(tmp_path / "broken.gguf", chat_template="{% for %}")
    rc, out, _ = _inspect(capsys, str(broken), "--json")
    assert rc == 0 and "does not compile" in json.loads(out)["chat_template_in_use"]["error"]
