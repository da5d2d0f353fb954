"""OpenAI Responses API (`POST /v1/responses`) request bodies, parsed into typed objects.

The same policy as the chat schemas (`edge.api.schemas`): supported fields are validated,
fields that do not change the output are accepted and ignored, fields that would change it in
a way edge cannot honour (built-in tools, background mode, conversations, prompt templates)
are a 400 naming the parameter; `reasoning.effort` is a 400 only where the model cannot think
(`edge.api.reasoning`). Input items are a tagged union on `type`
(a message may omit it, as OpenAI's "easy" input message does).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, field_validator

from edge.api.schemas import (
    FUNCTION_NAME,
    MAX_TOOLS,
    FunctionDef,
    JsonSchemaFormat,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ToolDef,
    _Sampling,
    _utf8,
    check_extras,
    parse_model,
)
from edge.errors import InvalidRequest

# Accepted and ignored whatever their value (they do not change the output edge produces).
IGNORED: frozenset[str] = frozenset({"user", "service_tier", "safety_identifier", "prompt_cache_key",
                                     "stream_options", "include", "truncation", "prompt_cache_retention"})
# Accepted only with these values (name -> allowed).
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "background": (None, False),
    "conversation": (None,),
    "prompt": (None,),
    "max_tool_calls": (None,),
    "top_logprobs": (None, 0),
}


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    status: str | None = None


class InputPart(BaseModel):
    """A content part: input_text / output_text (and refusal) carry text; others are refused later."""

    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None
    refusal: str | None = None

    _check_text = field_validator("text", "refusal")(_utf8)


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputPart]

    _check_content = field_validator("content")(_utf8)


class FunctionCallItem(_Item):
    """A call the model made earlier (sent back by the client, or from `previous_response_id`)."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=64)
    arguments: str = "{}"

    _check_text = field_validator("name", "arguments")(_utf8)


class FunctionCallOutputItem(_Item):
    """The result of a call, answered by `call_id`."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[InputPart]

    _check_output = field_validator("output")(_utf8)


class ReasoningItem(_Item):
    """Reasoning from another model, sent back in the history: no text of it reaches the prompt."""

    type: Literal["reasoning"]


def _item_tag(value: Any) -> str | None:
    if isinstance(value, MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem):
        return _ITEM_TAGS[value.type]
    kind = value.get("type", "message") if isinstance(value, dict) else None
    return _ITEM_TAGS.get(kind) if isinstance(kind, str) else None


_ITEM_TAGS = {"message": "MessageItem", "function_call": "FunctionCallItem",
              "function_call_output": "FunctionCallOutputItem", "reasoning": "ReasoningItem"}
InputItem = Annotated[
    Annotated[MessageItem, Tag("MessageItem")]
    | Annotated[FunctionCallItem, Tag("FunctionCallItem")]
    | Annotated[FunctionCallOutputItem, Tag("FunctionCallOutputItem")]
    | Annotated[ReasoningItem, Tag("ReasoningItem")],
    Discriminator(_item_tag, custom_error_type="invalid_item",
                  custom_error_message="input items must be of type message, function_call, "
                                       "function_call_output or reasoning"),
]


def _input_tag(value: Any) -> str:
    return "Text" if isinstance(value, str) else "Items"


# a string or a list of items; the tag picks the branch, so an error names the item, not "a string"
Input = Annotated[Annotated[str, Tag("Text")] | Annotated[list[InputItem], Tag("Items")],
                  Discriminator(_input_tag)]


class ResponsesTool(BaseModel):
    """A tool in the Responses shape: function tools are flat. Built-in tool types are refused
    (with their name) by `check_tools`."""

    model_config = ConfigDict(extra="ignore")
    type: str = Field(min_length=1)
    name: str | None = Field(None, pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _check_text = field_validator("description")(_utf8)


class FunctionToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(BaseModel):
    """`text.format`: text, json_object, or json_schema (flat: name, schema, strict)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # accepted, ignored


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="ignore")
    effort: str | None = None
    summary: str | None = None


class ResponsesRequest(_Sampling):
    model: str = Field(min_length=1)
    input: Input
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    tools: list[ResponsesTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    text: TextConfig | None = None
    stream: StrictBool | None = False
    previous_response_id: str | None = Field(None, min_length=1, max_length=256)
    store: StrictBool | None = True
    reasoning: Reasoning | None = None
    metadata: dict[str, str] | None = None

    _check_text = field_validator("input", "instructions")(_utf8)

    def response_format(self) -> ResponseFormat | None:
        """`text.format` as the chat route's `response_format` (one grammar path for both)."""
        fmt = self.text.format if self.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return ResponseFormat(type="json_object")
        if not fmt.schema_:
            raise InvalidRequest("text.format json_schema needs schema", "text.format.schema")
        return ResponseFormat(type="json_schema",
                              json_schema=JsonSchemaFormat(name=fmt.name or "response", schema=fmt.schema_))

    def function_tools(self) -> list[ToolDef]:
        """The function tools in the chat shape; a built-in tool type is a 400 naming it."""
        out = []
        for i, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise InvalidRequest(f"tools[{i}].type: {tool.type!r} tools are not supported by this "
                                     "server (only function tools, run by the client)", f"tools[{i}].type")
            if tool.name is None:
                raise InvalidRequest(f"tools[{i}].name is required", f"tools[{i}].name")
            fn = FunctionDef(name=tool.name, description=tool.description, parameters=tool.parameters,
                             strict=tool.strict)
            out.append(ToolDef(type="function", function=fn))
        return out

    def chat_tool_choice(self) -> str | NamedToolChoice | None:
        c = self.tool_choice
        if isinstance(c, FunctionToolChoice):
            return NamedToolChoice(type="function", function=NamedFunction(name=c.name))
        return c


def parse_responses_request(data: Any) -> ResponsesRequest:
    """Validate the body, then the unsupported-parameter policy (400 naming the parameter)."""
    body = parse_model(ResponsesRequest, data)
    check_extras(body, IGNORED, DEFAULT_ONLY)  # reasoning.effort: edge.api.reasoning (the model decides)
    return body


RESPONSES_MODELS: tuple[type[BaseModel], ...] = (ResponsesRequest,)
