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
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from edge.errors import TemplateError

PLAIN_TEMPLATE = (
    "{% for m in messages %}"
    "{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

MAX_RENDER_CHARS = 4 << 20  # a runaway template loop is cut off here


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
