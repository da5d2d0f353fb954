"""Chat templates from GGUF metadata, rendered in a jinja2 sandbox.

A GGUF file carries its template as text (`tokenizer.chat_template`) and
hostile files exist, so rendering uses `ImmutableSandboxedEnvironment` (no
attribute access to internals such as `__class__` or `__globals__`, no mutation
of passed objects) with the same helpers Hugging Face's `apply_chat_template`
provides (`raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII).
Every failure, including a sandbox violation, surfaces as `TemplateError`.

Models without a template (base models such as Gemma 3 270M) get the plain
transcript format `PLAIN_TEMPLATE`: one "Role: content" paragraph per message,
ending with "Assistant:" when a generation prompt is asked for. That is what a
user of a base model would type by hand, and it keeps /v1/chat/completions usable.
A base model does not know where its turn ends, so a fallback or named template
brings its own turn markers as stop strings (`TemplateInfo.stop`): without them
the model writes the user's next turn itself.

`--chat-template NAME|FILE` (setting `chat_template`) replaces the model's template
with one of `NAMED_TEMPLATES` or a Jinja file; `resolve_chat_template` turns the
setting into source text, `describe` says which template is in use (/v1/models,
`edge inspect`) and whether and in which syntax it can express tool calls.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from edge.errors import ConfigError, TemplateError
from edge.runtime.text.reasoning import template_family

PLAIN_TEMPLATE = (
    "{% for m in messages %}"
    "{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

MAX_RENDER_CHARS = 4 << 20  # a runaway template loop is cut off here
MAX_TEMPLATE_FILE_BYTES = 1 << 20

_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Hermes-style tool calling on ChatML (the format Qwen 2.5 and Hermes models were trained on):
# gives a model whose own template has no tools (e.g. SmolLM2) a way to see and call them.
# Every newline is written by an expression: `{%-` and trim_blocks would eat literal ones.
_CHATML_TOOLS = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' }}
{{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' }}
{{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m['role'] == 'system' and tools and loop.first %}
{%- elif m['role'] == 'assistant' and m.tool_calls %}
{{- '<|im_start|>assistant' }}
{%- if m['content'] %}{{- '\\n' + m['content'] }}{%- endif %}
{%- for tc in m.tool_calls %}
{{- '\\n<tool_call>\\n{"name": "' + tc.function.name + '", "arguments": ' }}
{{- tc.function.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif m['role'] == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- else %}
{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""
_LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
_CHATML_STOPS = ("<|im_end|>", "<|im_start|>")
_PLAIN_ROLES = ("User", "Assistant", "System", "Tool")


@dataclass(frozen=True)
class NamedTemplate:
    source: str
    stop: tuple[str, ...]  # the format's own turn markers, for models that do not know them
    description: str


NAMED_TEMPLATES: dict[str, NamedTemplate] = {
    "chatml": NamedTemplate(_CHATML, _CHATML_STOPS, "ChatML (<|im_start|>role ... <|im_end|>)"),
    "chatml-tools": NamedTemplate(_CHATML_TOOLS, _CHATML_STOPS,
                                  "ChatML with Hermes-style tool calls (<tool_call>{json}</tool_call>)"),
    "llama3": NamedTemplate(_LLAMA3, ("<|eot_id|>", "<|start_header_id|>"), "Llama 3 headers"),
    # the paragraph break belongs to the turn marker: "\n\nUser:" first, so no "\n" is left behind
    "plain": NamedTemplate(PLAIN_TEMPLATE,
                           tuple(f"{nl}{role}:" for role in _PLAIN_ROLES for nl in ("\n\n", "\n")),
                           "plain transcript (Role: text), the fallback for models without a template"),
}
FALLBACK_NAME = "plain"


@dataclass(frozen=True)
class TemplateChoice:
    """A template chosen by the user instead of the model's: its text and where it came from."""

    source: str
    origin: str  # "name" | "file" | "inline"
    name: str | None  # the built-in name, or the file path


def resolve_chat_template(value: str | None) -> TemplateChoice | None:
    """The `chat_template` setting -> template text. A built-in NAME, a Jinja FILE path, or (from
    Python) the Jinja text itself. ConfigError for an unknown name, an unreadable file or a
    template that does not compile, so a typo fails at startup and not at the first request."""
    if value is None or not value.strip():
        return None
    if value in NAMED_TEMPLATES:
        return TemplateChoice(NAMED_TEMPLATES[value].source, "name", value)
    if "{{" in value or "{%" in value:
        choice = TemplateChoice(value, "inline", None)
    else:
        path = Path(value).expanduser()
        if not path.is_file():
            names = ", ".join(NAMED_TEMPLATES)
            raise ConfigError("chat_template", f"{value!r} is neither a built-in template ({names}) "
                                               "nor a readable file")
        try:
            if path.stat().st_size > MAX_TEMPLATE_FILE_BYTES:
                raise ConfigError("chat_template", f"{path} is larger than {MAX_TEMPLATE_FILE_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError("chat_template", f"cannot read {path}: {exc}") from exc
        choice = TemplateChoice(text, "file", str(path))
    try:
        ChatTemplate(choice.source)
    except TemplateError as exc:
        raise ConfigError("chat_template", f"{choice.name or 'template'}: {exc}") from exc
    return choice


@dataclass(frozen=True)
class TemplateInfo:
    """Which template renders chats, and what it can express (reported by /v1/models, inspect)."""

    source: str  # "model" | "fallback" | "name" | "file" | "inline"
    name: str | None  # built-in name ("plain" for the fallback) or file path
    tools: bool  # the template reads the `tools` variable, so tool definitions reach the model
    tool_format: str | None  # "hermes" | "llama3" | "mistral" | "generic" (None: no tools)
    stop: tuple[str, ...] = ()  # turn markers that end generation (fallback and named templates)
    text: str = field(default="", repr=False, compare=False)  # the Jinja source (Ollama's /api/show)
    thinking: str | None = None  # the think-block family it teaches (reasoning.template_family)

    def as_json(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "tools": self.tools,
                "tool_format": self.tool_format, "stop": list(self.stop), "thinking": self.thinking}


def with_turn_stops(stop: tuple[str, ...], info: TemplateInfo | None) -> tuple[str, ...]:
    """`stop` plus the template's own turn markers (a fallback or named template), so a model
    does not go on to write the next turn itself; the one place API and facade both use."""
    if info is None:
        return stop
    return stop + tuple(s for s in info.stop if s not in stop)


def uses_tools(source: str) -> bool:
    """True when the template reads `tools` (HF convention), i.e. tool definitions reach the model."""
    try:
        ast = ImmutableSandboxedEnvironment().parse(source)
    except jinja2.TemplateError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(ast)


@functools.lru_cache(maxsize=32)
def tool_format(source: str) -> str | None:
    """The tool-call syntax a template teaches the model (llama.cpp's chat parsers detect it the same
    way, from the template text); None when the template has no tools. Cached: every chat request
    asks (`Engine.chat_template_info`), and parsing Qwen2.5's template took ~15 ms each time."""
    if not uses_tools(source):
        return None
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<tool_call>" in source:
        return "hermes"
    if "<|start_header_id|>" in source or "<|python_tag|>" in source:
        return "llama3"
    return "generic"


def describe(template: ChatTemplate, choice: TemplateChoice | None = None) -> TemplateInfo:
    """What `template` is, given the user's `choice` (None: the model's own or the fallback)."""
    named = next((n for n, t in NAMED_TEMPLATES.items() if t.source == template.source), None)
    if template.is_fallback:
        source, name = "fallback", FALLBACK_NAME
    elif choice is not None:
        source, name = choice.origin, choice.name
    else:
        source, name = "model", None
    # a model's own template ends turns with its end-of-generation token; a borrowed one may not
    stop = NAMED_TEMPLATES[named].stop if named is not None and source != "model" else ()
    fmt = tool_format(template.source)
    return TemplateInfo(source, name, fmt is not None, fmt, stop, template.source,
                        template_family(template.source))


class _TemplateRaise(Exception):
    pass


def _raise_exception(message: str) -> None:
    raise _TemplateRaise(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=False)


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled template plus the special-token texts it may refer to."""

    source: str
    bos_token: str = ""
    eos_token: str = ""
    is_fallback: bool = False

    def __post_init__(self) -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined, autoescape=False
        )
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        env.filters["tojson"] = _tojson
        try:
            compiled = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"template does not compile: {exc}") from exc
        object.__setattr__(self, "_compiled", compiled)

    def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        _validate_messages(messages)
        try:
            text = self._compiled.render(  # type: ignore[attr-defined]
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except _TemplateRaise as exc:
            raise TemplateError(f"template rejected the messages: {exc}") from exc
        except SecurityError as exc:
            raise TemplateError(f"template tried an unsafe operation: {exc}") from exc
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateError(f"{type(exc).__name__}: {exc}") from exc
        except RecursionError as exc:
            raise TemplateError("template recursion too deep") from exc
        if len(text) > MAX_RENDER_CHARS:
            raise TemplateError(f"rendered prompt exceeds {MAX_RENDER_CHARS} characters")
        return text

    def prompt(self, messages: list[dict[str, Any]], add_bos: bool, add_generation_prompt: bool = True,
               **extra: Any) -> str:
        """`render`, starting with the BOS text exactly when the model wants a BOS (`add_bos`):
        tokenize it without adding one (a double BOS is removed anyway)."""
        text = self.render(messages, add_generation_prompt, **extra)
        if add_bos and self.bos_token and not text.startswith(self.bos_token):
            text = self.bos_token + text
        return text


def _validate_messages(messages: list[dict[str, Any]]) -> None:
    if not isinstance(messages, list) or not messages:
        raise TemplateError("messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TemplateError(f"message {i} needs a string 'role'")
        if "content" in m and not isinstance(m["content"], (str, list, type(None))):
            raise TemplateError(f"message {i} has content of type {type(m['content']).__name__}")


def load_template(source: str | None, bos_token: str = "", eos_token: str = "") -> ChatTemplate:
    """The model's own template, or the documented plain fallback when it has none."""
    if source and source.strip():
        return ChatTemplate(source, bos_token, eos_token)
    return ChatTemplate(PLAIN_TEMPLATE, bos_token, eos_token, is_fallback=True)


def strip_leading_bos(text: str, bos_token: str) -> tuple[str, bool]:
    """Templates often start with the BOS text; the tokenizer adds BOS itself, so drop it
    from the text once to avoid a double BOS. Returns (text, whether it was stripped)."""
    if bos_token and text.startswith(bos_token):
        return text[len(bos_token) :], True
    return text, False
