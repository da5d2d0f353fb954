"""Ollama's native API request bodies as pydantic models, `keep_alive` and `options`.

Policy (Ollama's own where it can be honoured, a clear 400 where it cannot):
- unknown top-level fields and unknown `options` are ignored, as Ollama (Go's JSON decoder)
  ignores them; ignored options are logged at debug level;
- fields whose meaning edge cannot deliver (`images`, `suffix`, `think: true` for a model whose
  template cannot think, a Go `template`, `logprobs`) are a 400 naming the field, never silently
  dropped.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from edge.api.schemas import MAX_STOP, MAX_TOOLS, ToolDef, _utf8
from edge.contracts.options import MAX_TOP_LOGPROBS, PENALTY_ABS_MAX, REPEAT_PENALTY_MAX, TEMPERATURE_MAX
from edge.errors import InvalidRequest
from edge.units import parse_keep_alive as parse_keep_alive  # re-exported: the routes read it here

log = logging.getLogger("edge.api")

# Ollama's documented runtime options edge has no use for (threads, GPUs and memory are the
# scheduler's and the planner's business; mirostat, typical_p and tfs_z are not in edge's chain).
KNOWN_IGNORED_OPTIONS: frozenset[str] = frozenset({
    "num_keep", "typical_p", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta", "penalize_newline",
    "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "vocab_only", "use_mmap",
    "use_mlock", "num_thread", "logits_all", "embedding_only", "rope_frequency_base",
    "rope_frequency_scale", "num_gqa",
})

# --- keep_alive ---------------------------------------------------------------------------------
KeepAlive = StrictStr | StrictInt | StrictFloat



# --- options ------------------------------------------------------------------------------------
class Options(BaseModel):
    """`options`: the sampling and length options edge honours; others are ignored (debug log)."""

    model_config = ConfigDict(extra="allow")
    temperature: float | None = Field(None, ge=0.0, le=TEMPERATURE_MAX)  # the engine's bound (Ollama: none)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: StrictInt | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    num_predict: StrictInt | None = Field(None, ge=-2)  # -1: no limit, -2: fill the context (as Ollama)
    stop: list[str] | str | None = None
    seed: StrictInt | None = None
    repeat_penalty: float | None = Field(None, gt=0.0, le=REPEAT_PENALTY_MAX)
    repeat_last_n: StrictInt | None = Field(None, ge=-1)
    presence_penalty: float | None = Field(None, ge=-PENALTY_ABS_MAX, le=PENALTY_ABS_MAX)
    frequency_penalty: float | None = Field(None, ge=-PENALTY_ABS_MAX, le=PENALTY_ABS_MAX)
    num_ctx: StrictInt | None = Field(None, ge=1)
    reasoning_budget: StrictInt | None = None  # edge's: thinking tokens at most (edge.api.reasoning)

    _check_stop = field_validator("stop")(_utf8)

    @field_validator("stop")
    @classmethod
    def _stop_count(cls, v: list[str] | str | None) -> list[str] | str | None:
        if isinstance(v, list) and len(v) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        return v

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)

    def log_ignored(self) -> None:
        extra = sorted(self.model_extra or {})
        if extra:
            unknown = [k for k in extra if k not in KNOWN_IGNORED_OPTIONS]
            log.debug("ollama options ignored: %s%s", ", ".join(extra),
                      f" (unknown: {', '.join(unknown)})" if unknown else "")


class _Base(BaseModel):
    """Unknown fields are ignored, as Ollama does."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class _ModelRef(_Base):
    model: str = Field("", max_length=512)
    name: str | None = Field(None, max_length=512)  # the older spelling of `model`

    @model_validator(mode="after")
    def _one_name(self) -> _ModelRef:
        if not self.model and self.name:
            self.model = self.name
        if not self.model:
            raise ValueError("model is required")
        _utf8(self.model)
        return self


class _Generating(_ModelRef):
    """Fields /api/chat and /api/generate share."""

    stream: StrictBool = True
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options | None = None
    keep_alive: KeepAlive | None = Field(None, description="duration (\"5m\") or seconds; <0 forever")
    think: StrictBool | Literal["low", "medium", "high"] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def refuse_unsupported(self) -> None:
        """(`think` is checked against the model's template: edge.api.reasoning.)"""
        if self.logprobs:
            raise InvalidRequest("logprobs are not offered on the Ollama API here; use /v1/chat/completions "
                                 "(logprobs: true)", "logprobs")

    def keep_alive_s(self, default_s: float | None) -> float | None:
        """The keep-alive this request asks for (seconds; None: forever), `default_s` when absent."""
        return default_s if self.keep_alive is None else parse_keep_alive(self.keep_alive)


# --- /api/chat ----------------------------------------------------------------------------------
class CallFunction(_Base):
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] | str = Field(default_factory=dict)  # Ollama: an object
    index: StrictInt | None = None

    _check_name = field_validator("name")(_utf8)


class OllamaToolCall(_Base):
    id: str | None = Field(None, max_length=256)
    function: CallFunction


class Message(_Base):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = Field(None, max_length=256)  # tool results: which function answered
    tool_call_id: str | None = Field(None, max_length=256)
    thinking: str | None = None  # earlier reasoning of a thinking model: not shown to this one

    _check_content = field_validator("content")(_utf8)

    @field_validator("content", mode="before")
    @classmethod
    def _null_content(cls, v: Any) -> Any:
        return "" if v is None else v


class ChatRequest(_Generating):
    messages: list[Message] = Field(default_factory=list, max_length=4096)
    tools: list[ToolDef] | None = Field(None, max_length=MAX_TOOLS)


# --- /api/generate ------------------------------------------------------------------------------
class GenerateRequest(_Generating):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[StrictInt] | None = Field(None, max_length=1 << 20)
    raw: StrictBool = False
    images: list[str] | None = None

    _check_text = field_validator("prompt", "system", "suffix")(_utf8)


# --- /api/embed, /api/embeddings ----------------------------------------------------------------
class EmbedRequest(_ModelRef):
    input: str | list[str] = Field(default_factory=list)
    truncate: StrictBool = True
    dimensions: StrictInt | None = Field(None, ge=1)
    options: Options | None = None
    keep_alive: KeepAlive | None = None

    _check_input = field_validator("input")(_utf8)

    def inputs(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class EmbeddingsRequest(_ModelRef):
    """The legacy /api/embeddings: one `prompt`, one vector."""

    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive | None = None

    _check_prompt = field_validator("prompt")(_utf8)


# --- models -------------------------------------------------------------------------------------
class ShowRequest(_ModelRef):
    verbose: StrictBool = False


class PullRequest(_ModelRef):
    insecure: StrictBool = False
    stream: StrictBool = True


class DeleteRequest(_ModelRef):
    pass


REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    ChatRequest, GenerateRequest, EmbedRequest, EmbeddingsRequest, ShowRequest, PullRequest, DeleteRequest,
)
_REF = "#/components/schemas/{model}"


def ollama_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for an Ollama route: its body, and its errors in Ollama's shape."""
    error = {"description": "error", "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/OllamaError"}}}}
    ref = {"$ref": _REF.format(model="Ollama" + model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
            "responses": {code: error for code in ("400", "404", "413", "415", "503")}}


def ollama_components() -> dict[str, Any]:
    """JSON schemas of the Ollama request models (prefixed `Ollama`: names do not clash with
    the OpenAI ones), and Ollama's error body."""
    out: dict[str, Any] = {}
    for model in REQUEST_MODELS:
        schema = model.model_json_schema(ref_template=_REF.replace("{model}", "Ollama{model}"))
        out.update({"Ollama" + k: v for k, v in schema.pop("$defs", {}).items()})
        out["Ollama" + model.__name__] = schema
    out["OllamaError"] = {"type": "object", "required": ["error"],
                          "properties": {"error": {"type": "string"}}}
    return out
