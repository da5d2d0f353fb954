"""OpenAI request bodies parsed into typed objects at the edge.

Policy for parameters (so that unmodified OpenAI clients work and nothing is
silently wrong):
- supported ones are validated with OpenAI's bounds;
- ones clients send by default (`n=1`, `logprobs=false`, `user`, `store`,
  `parallel_tool_calls`, ...) are accepted and ignored while they keep their
  default value;
- any other parameter with a non-null value is rejected with 400 naming it.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edge.errors import InvalidRequest

# Accepted and ignored whatever their value: they do not change the output.
IGNORED_PARAMS: frozenset[str] = frozenset(
    {
        "user",
        "store",
        "metadata",
        "service_tier",
        "parallel_tool_calls",
        "safety_identifier",
        "prompt_cache_key",
    }
)
# Accepted only with their default value (name -> allowed values).
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
}

MAX_STOP = 16
# pydantic puts union member tags ("str", "list[int]", "ChatMessage", "function-after[...]") in error
# locations; they are not parameter names.
_UNION_TAG = re.compile(r"^(list\[.*\]|dict\[.*\]|str|int|float|bool|function-.*|[A-Z]\w*)$")


def _utf8(value: Any) -> Any:
    """Reject text that cannot be encoded (lone surrogates from JSON \\u escapes) before it reaches C."""
    texts = (
        [value]
        if isinstance(value, str)
        else [v for v in value if isinstance(v, str)]
        if isinstance(value, list)
        else []
    )
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text is not valid Unicode (lone surrogate)") from None
    return value


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class _SamplingFields(_Base):
    """Fields shared by both endpoints. `top_k`, `min_p`, `repeat_penalty` are llama.cpp extensions."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        _utf8(v)
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"bias for token {key} must be in [-100, 100]")
        return v

    def stop_tuple(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in (self.logit_bias or {}).items()}

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None

    _check_text = field_validator("text")(_utf8)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    _check_content = field_validator("content")(_utf8)

    def as_template_dict(self, index: int) -> dict[str, Any]:
        """Plain text content for the chat template; only text parts are supported."""
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise InvalidRequest(
                        f"content part type {part.type!r} is not supported (text only)",
                        f"messages[{index}].content",
                    )
                texts.append(part.text)
            content = "".join(texts)
        else:
            content = self.content or ""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: ResponseFormat | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    response_format: ResponseFormat | None = None

    _check_prompt = field_validator("prompt")(_utf8)

    def prompts(self) -> list[str | list[int]]:
        """One entry per choice: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidRequest("prompt must not be empty", "prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else 16  # OpenAI's default here


def _check_extras(model: BaseModel) -> None:
    """Reject non-default values of parameters we do not implement."""
    for name, value in (model.model_extra or {}).items():
        if name in IGNORED_PARAMS or value is None:
            continue
        if name in DEFAULT_ONLY:
            if value in DEFAULT_ONLY[name]:
                continue
            raise InvalidRequest(f"parameter {name}={value!r} is not supported by this server", name)
        raise InvalidRequest(f"unsupported parameter: {name}", name)


def parse_body(cls: type[_SamplingFields], data: Any) -> Any:
    """Validate a decoded JSON body into `cls`, raising InvalidRequest naming the first bad param."""
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        parsed = cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not _UNION_TAG.match(str(p))]
        param = _param_path(loc)
        msg = err["msg"].removeprefix("Value error, ")
        raise InvalidRequest(f"{param}: {msg}" if param else msg, param) from None
    _check_extras(parsed)
    return parsed


def _param_path(loc: list[str]) -> str | None:
    out = ""
    for part in loc:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out or None
