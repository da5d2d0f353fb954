"""OpenAI request bodies parsed into typed objects at the edge.

Policy for parameters (so that unmodified OpenAI clients work and nothing is
silently wrong):
- supported ones are validated with OpenAI's bounds;
- ones clients send by default (`n=1`, `logprobs=false`, `user`, `store`, ...)
  are accepted and ignored while they keep their default value;
- any other parameter with a non-null value is rejected with 400 naming it.
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator

from edge.contracts.options import (
    DRAFT_MAX_LIMIT,
    MAX_TOP_LOGPROBS,
    PENALTY_ABS_MAX,
    REPEAT_PENALTY_MAX,
    TEMPERATURE_MAX,
)
from edge.errors import InvalidRequest

# Accepted and ignored whatever their value: they do not change the output.
IGNORED_PARAMS: frozenset[str] = frozenset(
    {
        "user",
        "store",
        "metadata",
        "service_tier",
        "parallel_tool_calls",  # a field of chat requests; on /v1/completions it means nothing
        "safety_identifier",
        "prompt_cache_key",
    }
)
# Accepted only with their default value (name -> allowed values).
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
    "web_search_options": (None,),
}
REASONING_PARAMS = frozenset({"reasoning_effort", "chat_template_kwargs", "reasoning_budget",
                              "reasoning_format"})

MAX_STOP = 16
MAX_TOOLS = 128  # as OpenAI
# OpenAI's rule for function names; also keeps names safe inside tool-call syntax and grammars
FUNCTION_NAME = r"^[A-Za-z0-9_.\-]{1,64}$"
# pydantic puts union member tags ("str", "list[int]", "ChatMessage", "function-after[...]") in error
# locations; they are not parameter names.
_UNION_TAG = re.compile(r"^(list\[.*\]|dict\[.*\]|literal\[.*\]|str|int|float|bool|function-.*|[A-Z]\w*)$")


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


class _Sampling(_Base):
    """Sampling fields of every generating endpoint. `top_k`, `min_p`, `repeat_penalty` are
    llama.cpp extensions."""

    temperature: float | None = Field(None, ge=0.0, le=TEMPERATURE_MAX)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, gt=0.0, le=REPEAT_PENALTY_MAX)
    presence_penalty: float | None = Field(None, ge=-PENALTY_ABS_MAX, le=PENALTY_ABS_MAX)
    frequency_penalty: float | None = Field(None, ge=-PENALTY_ABS_MAX, le=PENALTY_ABS_MAX)
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    # speculative decoding (edge extension, llama.cpp-style): true forces it on (400 where the
    # model's cache cannot roll back), false off, absent: the engine's adaptive choice;
    # n_draft caps the tokens drafted per step (0: off)
    speculative: StrictBool | None = None
    n_draft: int | None = Field(None, ge=0, le=DRAFT_MAX_LIMIT)

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (v or {}).items():
            if not key.lstrip("-").isdigit() or int(key) < 0:
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"bias for token {key} must be in [-100, 100]")
        return v

    def logit_bias_ids(self) -> dict[int, float]:
        return {int(k): float(v) for k, v in (self.logit_bias or {}).items()}


class _SamplingFields(_Sampling):
    """Fields shared by the chat and text completion endpoints."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        _utf8(v)
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return v

    def stop_tuple(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(s for s in stops if s)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None

    _check_text = field_validator("text")(_utf8)


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None

    _check_text = field_validator("description")(_utf8)


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)


class NamedToolChoice(BaseModel):
    """`{"type": "function", "function": {"name": ...}}`: call exactly this function."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; an object is accepted too

    _check_text = field_validator("name", "arguments")(_utf8)


class ToolCall(BaseModel):
    """A call the assistant made earlier in the conversation."""

    model_config = ConfigDict(extra="ignore")
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the id of the call this answers

    _check_content = field_validator("content")(_utf8)

    def text(self, index: int) -> str:
        """Plain text content; only text parts are supported."""
        if isinstance(self.content, list):
            texts = []
            for part in self.content:
                if part.type != "text" or part.text is None:
                    raise InvalidRequest(
                        f"content part type {part.type!r} is not supported (text only)",
                        f"messages[{index}].content",
                    )
                texts.append(part.text)
            return "".join(texts)
        return self.content or ""

    def as_template_dict(self, index: int) -> dict[str, Any]:
        """The message as chat templates see it (tool calls: `edge.api.tools.template_messages`)."""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.text(index)}


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    # llama.cpp's server default: one call per turn unless the client asks for more
    parallel_tool_calls: StrictBool | None = None
    logprobs: StrictBool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprobs_n(self) -> int | None:
        """Alternatives per token for the engine (None: no log probabilities, at no cost)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", "top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_SamplingFields):
    # StrictInt: JSON true/false are not token ids (pydantic would read true as 1)
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    response_format: ResponseFormat | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # legacy completions: alternatives/token

    def logprobs_n(self) -> int | None:
        return self.logprobs

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


class EmbeddingRequest(BaseModel):
    """/v1/embeddings. Unknown fields are refused (nothing here is worth ignoring silently)."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _no_booleans(cls, v: Any) -> Any:
        """JSON true/false are not token ids (pydantic would take them as 1/0)."""
        items = v if isinstance(v, list) else [v]
        flat = [x for item in items for x in (item if isinstance(item, list) else [item])]
        if any(isinstance(x, bool) for x in flat):
            raise ValueError("token ids must be integers, not booleans")
        return v

    def inputs(self) -> list[str | list[int]]:
        v = self.input
        if isinstance(v, str):
            return [v]
        if not v:
            raise InvalidRequest("input must not be empty", "input")
        if all(isinstance(x, int) for x in v):
            return [list(v)]  # type: ignore[arg-type]
        return list(v)  # type: ignore[arg-type]



def check_extras(model: BaseModel, ignored: frozenset[str] = IGNORED_PARAMS,
                 default_only: dict[str, tuple[Any, ...]] = DEFAULT_ONLY) -> None:
    """Reject non-default values of parameters we do not implement (400 naming the parameter);
    `ignored` ones pass, and so does any parameter sent as null."""
    for name, value in (model.model_extra or {}).items():
        if name in ignored or name in REASONING_PARAMS or value is None:  # those: edge.api.reasoning
            continue
        if name in default_only:
            if value in default_only[name]:
                continue
            raise InvalidRequest(f"parameter {name}={value!r} is not supported by this server", name)
        raise InvalidRequest(f"unsupported parameter: {name}", name)


M = TypeVar("M", bound=BaseModel)


def parse_model(cls: type[M], data: Any) -> M:
    """Validate a decoded JSON body into `cls`, raising InvalidRequest naming the first bad param."""
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not _UNION_TAG.match(str(p))]
        param = _param_path(loc)
        msg = err["msg"].removeprefix("Value error, ")
        raise InvalidRequest(f"{param}: {msg}" if param else msg, param) from None


def parse_body(cls: type[_SamplingFields], data: Any) -> Any:
    """`parse_model` for the completion endpoints, then their unsupported-parameter policy."""
    parsed = parse_model(cls, data)
    check_extras(parsed)
    return parsed


def _param_path(loc: list[str]) -> str | None:
    out = ""
    for part in loc:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out or None


# --- OpenAPI ----------------------------------------------------------------------------------
# The routes read the raw body themselves (the nesting check runs before any parse), so FastAPI
# cannot infer the request bodies; they are declared from these models instead.
REQUEST_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionRequest, CompletionRequest, EmbeddingRequest)
_REF = "#/components/schemas/{model}"


def request_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route whose JSON body is `model` (schemas: `openapi_components`)."""
    ref = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def openapi_components(models: tuple[type[BaseModel], ...] = REQUEST_MODELS) -> dict[str, Any]:
    """JSON schemas of the request models and everything they refer to, for components.schemas."""
    out: dict[str, Any] = {}
    for model in models:
        schema = model.model_json_schema(ref_template=_REF)
        out.update(schema.pop("$defs", {}))
        out[model.__name__] = schema
    out["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "object", "required": ["message", "type"], "properties": {
            "message": {"type": "string"}, "type": {"type": "string"},
            "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
    }
    return out
