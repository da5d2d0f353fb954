"""Tool calling: request checks, history for the template, and the grammar that forces a call.

The model writes tool calls in the syntax its chat template taught it (`tool_format`,
detected from the template text as llama.cpp's server chat parsers do):

- hermes (Qwen 2.5, Hermes, `chatml-tools`): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- llama3: `{"name": ..., "parameters": {...}}`, possibly after `<|python_tag|>`;
- mistral: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}]`;
- generic: a bare JSON object `{"name": ..., "arguments": ...}`.

`tool_choice` "required" or a named function is enforced by a grammar: the JSON schema
of the call (name const + the function's parameters) goes through llama.cpp's converter
and is wrapped in the family's syntax, so the arguments are valid for the schema by
construction. "auto" parses whatever the model wrote (`edge.toolcalls`).
/v1/responses declares tools flat (`{type, name, parameters}`); `plan_tool_calls` serves both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from edge.api.schemas import ChatCompletionRequest, ChatMessage, NamedToolChoice, ToolDef
from edge.errors import InvalidRequest
from edge.runtime.llama.sampling import json_schema_to_grammar
from edge.runtime.text.chat_template import TemplateInfo
from edge.toolcalls import CallScanner, JsonArgs, template_arguments

CALL_RULE = "edge-tool-call"  # the converter's root rule, renamed under the family's wrapper
_ANY_ARGS: dict[str, Any] = {"type": "object"}


__all__ = ["JsonArgs", "ToolPlan", "call_grammar", "check_history", "plan_tool_calls", "plan_tools",
           "template_messages"]


# --- the request --------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolPlan:
    """What the tool fields of one chat request mean for rendering, sampling and the response."""

    mode: str  # "none" | "auto" | "required" | "named"
    tools: list[dict[str, Any]] | None = None  # for the template (HF convention); None: not shown
    names: frozenset[str] = frozenset()
    fmt: str = "generic"
    grammar: str | None = None  # forced modes only
    parallel: bool = False

    @property
    def active(self) -> bool:
        return self.mode != "none"

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")

    def scanner(self, stream_calls: bool = False) -> CallScanner:
        """The call parser; `stream_calls`: also call_start/call_args events as calls decode."""
        return CallScanner(self.fmt, self.names, forced=self.forced, stream_calls=stream_calls)


def plan_tools(body: ChatCompletionRequest, info: TemplateInfo | None) -> ToolPlan:
    """The tool fields of a chat request; InvalidRequest naming the field."""
    constrained = body.response_format is not None and body.response_format.type != "text"
    return plan_tool_calls(body.tools or [], body.tool_choice, bool(body.parallel_tool_calls), info,
                           constrained_by="response_format" if constrained else None)


def plan_tool_calls(
    tools: list[ToolDef],
    choice: str | NamedToolChoice | None,
    parallel: bool,
    info: TemplateInfo | None,
    *,
    constrained_by: str | None = None,
    flat: bool = False,
) -> ToolPlan:
    """Check tools and tool_choice against each other and the template. `constrained_by` names the
    request's output-format parameter when it constrains the output; `flat`: error params in the
    Responses shape (`tools[i].name`, `tool_choice.name`)."""
    mode = "named" if isinstance(choice, NamedToolChoice) else (choice or "auto")
    if not tools:
        if mode in ("required", "named"):
            raise InvalidRequest(f"tool_choice {_choice_text(choice)} needs tools", "tool_choice")
        return ToolPlan("none")
    if mode == "none":
        return ToolPlan("none")  # the tools are not shown: the model answers in text
    if info is None or not info.tools:
        where = "the model's chat template" if info is None or info.source == "model" else (
            f"the chat template in use ({info.name or info.source})")
        raise InvalidRequest(
            f"{where} has no tool support (it does not use `tools`); serve the model with a "
            "tool-capable template, e.g. `edge serve MODEL --chat-template chatml-tools`, or send "
            'tool_choice "none"', "tools")
    field = "tools[{i}].{f}" if flat else "tools[{i}].function.{f}"
    names = [t.function.name for t in tools]
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            param = field.format(i=i, f="name")
            raise InvalidRequest(f"{param}: {name!r} is declared twice", param)
        seen.add(name)
    if constrained_by is not None:
        raise InvalidRequest(f"{constrained_by} cannot be combined with tools (both constrain the output); "
                             f'send tool_choice "none" or drop {constrained_by}', constrained_by)
    schemas = [_parameters_schema(t, field.format(i=i, f="parameters")) for i, t in enumerate(tools)]
    fmt = info.tool_format or "generic"
    functions = list(zip(names, schemas, strict=True))
    if isinstance(choice, NamedToolChoice):
        wanted = choice.function.name
        if wanted not in seen:
            raise InvalidRequest(f"tool_choice names {wanted!r}, which is not among the tools",
                                 "tool_choice.name" if flat else "tool_choice.function.name")
        functions = [functions[names.index(wanted)]]
    grammar = None
    if mode in ("required", "named"):
        try:
            grammar = call_grammar(fmt, functions, parallel)
        except InvalidRequest as exc:  # each schema compiled alone; together they did not
            raise InvalidRequest(f"tools: {exc}", "tools") from None
    return ToolPlan(mode, [t.model_dump(exclude_none=True) for t in tools], frozenset(names), fmt, grammar,
                    parallel)


def _choice_text(choice: object) -> str:
    return repr(choice) if isinstance(choice, str) else "naming a function"


def _parameters_schema(tool: ToolDef, param: str) -> dict[str, Any]:
    """The function's parameters schema, checked to compile to a grammar (400 naming `param`)."""
    schema = tool.function.parameters if tool.function.parameters is not None else _ANY_ARGS
    try:
        json_schema_to_grammar(schema)
    except InvalidRequest as exc:
        raise InvalidRequest(f"{param}: {exc}", param) from None
    return schema


def check_history(messages: list[ChatMessage]) -> None:
    """Tool messages must answer a call an earlier assistant message made (by id)."""
    ids: dict[str, str] = {}
    for i, m in enumerate(messages):
        if m.tool_calls and m.role != "assistant":
            raise InvalidRequest(f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                                 f"messages[{i}].tool_calls")
        for c in m.tool_calls or []:
            ids[c.id] = c.function.name
        if m.role == "tool":
            if not m.tool_call_id:
                raise InvalidRequest(f"messages[{i}].tool_call_id is required for role 'tool'",
                                     f"messages[{i}].tool_call_id")
            if m.tool_call_id not in ids:
                raise InvalidRequest(
                    f"messages[{i}].tool_call_id {m.tool_call_id!r} does not match a tool call of an "
                    "earlier assistant message", f"messages[{i}].tool_call_id")


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages as HF-style templates expect them: assistant `tool_calls` with `function.arguments`
    as a mapping (also printable as JSON), tool messages with `tool_call_id` and the call's `name`."""
    names = {c.id: c.function.name for m in messages for c in m.tool_calls or []}
    out = []
    for i, m in enumerate(messages):
        d = m.as_template_dict(i)
        if m.tool_calls:
            d["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.function.name, "arguments": template_arguments(c.function.arguments)}}
                for c in m.tool_calls
            ]
        if m.role == "tool" and m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
            d["name"] = m.name or names.get(m.tool_call_id, "")
        out.append(d)
    return out


# --- the grammar ------------------------------------------------------------------------------


def call_schema(fmt: str, name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """One call as JSON: the name fixed, the arguments under the key the family uses."""
    key = "parameters" if fmt == "llama3" else "arguments"
    return {"type": "object", "properties": {"name": {"const": name}, key: parameters},
            "required": ["name", key], "additionalProperties": False}


def call_grammar(fmt: str, functions: list[tuple[str, dict[str, Any]]], parallel: bool) -> str:
    """GBNF that admits exactly a call (or, with `parallel`, several) of one of `functions`, written in
    the family's syntax. Each function's `$defs` are moved to the root so its `$ref`s still resolve."""
    defs: dict[str, Any] = {}
    alts = []
    for i, (name, params) in enumerate(functions):
        params, own = _rebase_defs(params, f"f{i}-")
        defs.update(own)
        alts.append(call_schema(fmt, name, params))
    one: dict[str, Any] = alts[0] if len(alts) == 1 else {"anyOf": alts}
    if fmt in ("mistral", "generic") and parallel:
        schema: dict[str, Any] = {"type": "array", "items": one, "minItems": 1}
    elif fmt == "mistral":
        schema = {"type": "array", "items": one, "minItems": 1, "maxItems": 1}
    else:
        schema = one
    if defs:
        schema = {**schema, "$defs": defs}
    body = _rename_rule(json_schema_to_grammar(schema), "root", CALL_RULE)
    if fmt == "hermes":
        call = f'"<tool_call>\\n" {CALL_RULE} "\\n</tool_call>"'
        root = f"root ::= {call} (\"\\n\" {call})*" if parallel else f"root ::= {call}"
    elif fmt == "mistral":
        root = f'root ::= "[TOOL_CALLS]" {CALL_RULE}'
    else:  # llama3 (one call per turn, as llama.cpp) and generic: bare JSON
        root = f"root ::= {CALL_RULE}"
    return root + "\n" + body


_GBNF_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z0-9_-]+|\s+|.', re.S)


def _rename_rule(gbnf: str, old: str, new: str) -> str:
    """Rename rule `old` (definition and references), leaving string literals and classes alone."""
    return "".join(new if tok == old else tok for tok in _GBNF_TOKEN.findall(gbnf))


def _rebase_defs(schema: dict[str, Any], prefix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(schema without its $defs/definitions, those defs renamed `prefix+name`), refs rewritten."""
    own = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    if not own:
        return schema, {}
    rest = {k: v for k, v in schema.items() if k not in ("$defs", "definitions")}

    def fix(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for k, v in node.items():
                if k == "$ref" and isinstance(v, str):
                    m = re.fullmatch(r"#/(?:\$defs|definitions)/(.+)", v)
                    out[k] = f"#/$defs/{prefix}{m.group(1)}" if m else v
                else:
                    out[k] = fix(v)
            return out
        if isinstance(node, list):
            return [fix(v) for v in node]
        return node

    return fix(rest), {f"{prefix}{k}": fix(v) for k, v in own.items()}
