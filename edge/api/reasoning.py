"""Thinking on the HTTP routes: what a request asks, its 400s, the template switch and the budget.

Every generating route reads the same three things, in its own API's words:

    thinking on/off   Ollama `think` (true/false/"low"/"medium"/"high"); OpenAI `reasoning_effort`
                      and Responses `reasoning.effort` ("none", "minimal": off);
                      `chat_template_kwargs.enable_thinking` (the effort wins)
    a budget          `reasoning_budget` (OpenAI and Responses bodies, Ollama `options`): a cap in
                      tokens, 0..the context; the budget in force (setting shrunk by the device's
                      state, `edge.scheduler.reasoning`) caps it
    the format        `reasoning_format` (OpenAI body) over `--reasoning-format`

Thinking on/off reaches the chat template as `enable_thinking` (and an effort as `reasoning_effort`,
which gpt-oss's template reads); with nothing asked the template's default stands, except that a
budget of 0 turns thinking off (llama-server's meaning). A template that cannot think (no think
family, `TemplateInfo.thinking`) refuses a request for thinking with a 400 naming the field.
`ThinkPlan.attach` gives the engine request its `ReasoningSpec` (markers, whether the prompt opened
the block, the budget); a constrained output (a grammar: JSON formats, forced tool calls) is not
split, since a grammar leaves no room for a think block. The engine does the splitting
(runtime/step/think.py): events carry `reasoning` beside `text`, usage `reasoning_tokens`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from edge.contracts.options import REASONING_FORMATS
from edge.errors import InvalidRequest
from edge.runtime.text.reasoning import Markers, ReasoningSpec, markers_for, opened_by_prompt
from edge.scheduler.reasoning import ThinkingBudget, request_budget, thinking_budget

if TYPE_CHECKING:
    from edge.api.generation import Generation, Job
    from edge.api.state import ApiState
    from edge.runtime.text.chat_template import TemplateInfo
    from edge.runtime.types import TokenEvent, Usage
    from edge.toolcalls import CallScanner

EFFORTS = ("none", "minimal", "low", "medium", "high")
NO_THINKING = ("none", "minimal")  # efforts that ask for no thinking (what any model can do)
RESERVED_KWARGS = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


@dataclass(frozen=True)
class ThinkAsk:
    """What one request asks of thinking, whichever API it came through."""

    model: str
    enable: bool | None = None  # None: the template's default
    param: str = "think"  # the field that asked (a 400 names it)
    effort: str | None = None
    budget_tokens: int | None = None
    budget_param: str = "reasoning_budget"
    reasoning_format: str | None = None  # None: the server's setting
    template_kwargs: dict[str, Any] = field(default_factory=dict)


def _int(value: Any, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{param} must be an integer number of tokens", param)
    return value


def _effort(value: Any, param: str) -> str | None:
    if value is None:
        return None
    if value not in EFFORTS:
        raise InvalidRequest(f"{param} must be one of {', '.join(EFFORTS)}", param)
    return str(value)


def ask_openai(model: str, extra: dict[str, Any]) -> ThinkAsk:
    """From a chat body's extras: reasoning_effort, chat_template_kwargs, reasoning_budget/_format."""
    effort = _effort(extra.get("reasoning_effort"), "reasoning_effort")
    kwargs = extra.get("chat_template_kwargs")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise InvalidRequest("chat_template_kwargs must be an object", "chat_template_kwargs")
    bad = sorted(RESERVED_KWARGS.intersection(kwargs))
    if bad:
        where = f"chat_template_kwargs.{bad[0]}"
        raise InvalidRequest(f"{where} is set by the server", where)
    enable_kw = kwargs.get("enable_thinking")
    if enable_kw is not None and not isinstance(enable_kw, bool):
        raise InvalidRequest("chat_template_kwargs.enable_thinking must be true or false",
                             "chat_template_kwargs.enable_thinking")
    fmt = extra.get("reasoning_format")
    if fmt is not None and fmt not in REASONING_FORMATS:
        raise InvalidRequest(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}",
                             "reasoning_format")
    enable, param = enable_kw, "chat_template_kwargs.enable_thinking"
    if effort is not None:  # the effort wins over the template kwarg
        enable, param = effort not in NO_THINKING, "reasoning_effort"
    kw = {k: v for k, v in kwargs.items() if k != "enable_thinking"}
    return ThinkAsk(model, enable, param, effort if enable else None,
                    _int(extra.get("reasoning_budget"), "reasoning_budget"), "reasoning_budget", fmt, kw)


def ask_ollama(model: str, think: bool | str | None, budget: int | None) -> ThinkAsk:
    """From Ollama's `think` and `options.reasoning_budget`."""
    effort = think if isinstance(think, str) else None
    enable = None if think is None else bool(think)
    return ThinkAsk(model, enable, "think", effort, budget, "options.reasoning_budget")


def ask_responses(model: str, effort: str | None, extra: dict[str, Any]) -> ThinkAsk:
    """From a Responses body: `reasoning.effort` and `reasoning_budget`."""
    effort = _effort(effort, "reasoning.effort")
    enable = None if effort is None else effort not in NO_THINKING
    return ThinkAsk(model, enable, "reasoning.effort", effort if enable else None,
                    _int(extra.get("reasoning_budget"), "reasoning_budget"))


def budget_in_force(st: ApiState) -> ThinkingBudget:
    """The setting, shrunk by the scheduler's last decision (as /v1/status shows it)."""
    base = st.settings.reasoning_budget
    return st.scheduler.reasoning_budget(base) if st.scheduler is not None else thinking_budget(base, None)


@dataclass(frozen=True)
class ThinkPlan:
    """How one request thinks: what the template gets, and what the engine request gets."""

    render_kwargs: dict[str, Any]  # {} or {"template_kwargs": {...}} for `render_chat`
    markers: Markers | None  # None: the output is not split
    budget_tokens: int | None = None
    keep_markers: bool = False

    def attach(self, job: Job, prompt: str | list[int]) -> Job:
        """`job` with its think block to split (none under a grammar, or without markers)."""
        if self.markers is None or job.request.sampling.grammar is not None:
            return job
        started = isinstance(prompt, str) and opened_by_prompt(prompt, self.markers)
        spec = ReasoningSpec(self.markers, started, self.budget_tokens, self.keep_markers)
        return replace(job, request=replace(job.request, reasoning=spec))


def plan_thinking(st: ApiState, ask: ThinkAsk, info: TemplateInfo | None, n_ctx: int) -> ThinkPlan:
    """The 400s (thinking asked of a model that cannot; a budget outside 0..n_ctx), then the plan."""
    family = info.thinking if info is not None else None
    if ask.enable and family is None:
        raise InvalidRequest(f"model {ask.model!r} does not support thinking (its chat template has no "
                             "think block; --chat-template can give it one)", ask.param)
    if ask.budget_tokens is not None and not 0 <= ask.budget_tokens <= n_ctx:
        raise InvalidRequest(f"{ask.budget_param} must be in 0..{n_ctx} (the context), got "
                             f"{ask.budget_tokens}", ask.budget_param)
    budget = request_budget(budget_in_force(st), ask.budget_tokens)
    kwargs = dict(ask.template_kwargs)
    if family is not None:
        enable = ask.enable if ask.enable is not None or budget != 0 else False
        if enable is not None:
            kwargs["enable_thinking"] = enable
        if ask.effort is not None and enable:
            kwargs["reasoning_effort"] = ask.effort
    fmt = ask.reasoning_format or st.settings.reasoning_format
    return ThinkPlan({"template_kwargs": kwargs} if kwargs else {}, markers_for(fmt, family), budget,
                     fmt == "deepseek-legacy")


def usage_details(u: Usage) -> dict[str, int]:
    """OpenAI's `completion_tokens_details` / Responses' `output_tokens_details`."""
    return {"reasoning_tokens": u.reasoning_tokens}


def status(st: ApiState) -> dict[str, Any]:
    """For /v1/status: the format and the thinking budget in force, and why."""
    return {"format": st.settings.reasoning_format, "budget": budget_in_force(st).as_dict()}


# --- Ollama's shapes: `thinking` beside `content` (chat), or beside `response` (generate) ------------


def ollama_events(ev: TokenEvent, scanner: CallScanner | None) -> list[tuple[str, Any]]:
    """One engine event as /api/chat's chunk events: its thinking first, then content and calls."""
    out: list[tuple[str, Any]] = [("thinking", ev.reasoning)] if ev.reasoning else []
    if ev.text:
        out += scanner.feed(ev.text) if scanner is not None else [("content", ev.text)]
    return out


def with_thinking(whole: Callable[[Generation], dict[str, Any]],
                  key: str | None = "message") -> Callable[[Generation], dict[str, Any]]:
    """An unstreamed Ollama answer with the whole thinking beside the answer (`key`: in the message,
    or at the top for /api/generate)."""

    def answer(g: Generation) -> dict[str, Any]:
        obj = whole(g)
        thinking = g.outcomes[0].reasoning if g.outcomes else ""
        if thinking:
            (obj[key] if key is not None else obj)["thinking"] = thinking
        return obj

    return answer
