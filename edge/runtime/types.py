"""Plain types shared by the engine, the scheduler and the API.

This module must not import `llama_cpp`: the scheduler and API import it
without touching the native library, and tests build these objects freely.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

# the engine's contract types live in a leaf module; re-exported here for the runtime's users
from edge.contracts.engine import EngineState, EngineStats, Knobs, Priority
from edge.contracts.options import MAX_TOP_LOGPROBS  # noqa: F401  (re-exported: the engine checks it)

if TYPE_CHECKING:
    from edge.runtime.text.chat_template import TemplateInfo
    from edge.runtime.text.reasoning import ReasoningSpec


class FinishReason(str, Enum):
    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens reached or the context is full
    CANCELLED = "cancelled"
    ERROR = "error"



@dataclass(frozen=True)
class SamplingParams:
    """Sampler-chain settings; validated by `validate()` before a request is queued."""

    temperature: float = 0.8  # 0 means greedy
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1.0 disables
    min_p: float = 0.05  # 0 disables
    repeat_penalty: float = 1.0  # 1.0 disables
    repeat_last_n: int = 64
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None  # None: a fresh random seed per request
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> bias
    grammar: str | None = None  # GBNF, root rule "root"


@dataclass(frozen=True)
class GenerationRequest:
    """One completion to run. `prompt` is text (tokenized with BOS as the model wants) or token ids."""

    prompt: str | list[int]
    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    priority: Priority = Priority.INTERACTIVE
    request_id: str = ""
    # Text prompts from chat templates already contain BOS text; the renderer sets this False.
    add_bos: bool = True
    # log probabilities: None off (no cost); n >= 0: each token's own, plus its n most likely alternatives
    logprobs: int | None = None
    # speculative decoding: None lets the engine choose (adaptive); False off; True on (the engine
    # refuses it where the context cannot roll back). n_draft caps the drafted tokens per step.
    speculative: bool | None = None
    n_draft: int | None = None
    # a think block to keep apart from the answer, and its budget (runtime/step/think.py); None: none
    reasoning: ReasoningSpec | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens reused from the KV cache (prefix reuse)
    reasoning_tokens: int = 0  # completion tokens spent inside the think block (markers included)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability under the model (natural log, raw logits' softmax)."""

    token: str  # its text (a partial UTF-8 sequence shows replacement characters; `bytes` is exact)
    bytes: bytes
    logprob: float
    top: tuple[tuple[str, bytes, float], ...] = ()  # the most likely alternatives, best first


@dataclass(frozen=True)
class TokenEvent:
    """A piece of output. The last event of a request has `finish_reason` set (and maybe empty text)."""

    text: str
    n_tokens: int = 0  # tokens this event accounts for
    finish_reason: FinishReason | None = None
    usage: Usage | None = None  # set on the last event
    error: Exception | None = None  # set when finish_reason is ERROR
    logprobs: tuple[TokenLogprob, ...] = ()  # the tokens since the last event, when asked for
    reasoning: str = ""  # think-block text (requests with a ReasoningSpec); `text` is then the answer


@dataclass(frozen=True)
class CompletionResult:
    """What a blocking completion returns: the whole text and how it ended."""

    text: str
    finish_reason: FinishReason
    usage: Usage
    ttft_s: float  # submit -> first event
    total_s: float  # submit -> final event
    logprobs: tuple[TokenLogprob, ...] = ()  # when the request asked for them




@dataclass(frozen=True)
class ResidencyStatus:
    """Whether the model's weights are in memory and when keep-alive would unload them."""

    loaded: bool
    keep_alive_s: float | None  # None: never unloads on its own
    expires_in_s: float | None  # None: not counting down (busy, unloaded or no keep-alive)
    busy: bool = False


class RequestHandleLike(Protocol):
    """What `submit` returns: a stream of `TokenEvent`s ending with one that has `finish_reason`."""

    request_id: str

    def __iter__(self) -> Iterator[TokenEvent]: ...  # blocking, for threads and the CLI

    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...  # for asyncio (the API)

    def cancel(self) -> None: ...  # frees the sequence and its KV at the next step

    def quiet(self) -> None: ...  # an asyncio consumer woken for the first token and the end only

    @property
    def done(self) -> bool: ...


class EmbedJobLike(Protocol):
    """What `embed` returns: a future of one L2-normalised vector (numpy float32) per input."""

    future: concurrent.futures.Future[list[Any]]

    @property
    def n_tokens(self) -> int: ...


class EngineLike(Protocol):
    """The engine as the API and the scheduler see it (fakes in tests implement this)."""

    model_name: str
    n_ctx: int  # context length per sequence
    n_slots: int

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]: ...  # any thread

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    tools: list[dict[str, Any]] | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> str: ...

    @property
    def chat_template_info(self) -> TemplateInfo | None: ...  # None until the model was loaded

    @property
    def has_chat_template(self) -> bool: ...  # False for a base model (render_chat falls back)

    def submit(  # raises typed errors, never later
        self, request: GenerationRequest, on_start: Callable[[], None] | None = None
    ) -> RequestHandleLike: ...  # on_start: called (engine thread) once the request holds a slot

    def apply(self, knobs: Knobs) -> None: ...

    def stats(self) -> EngineStats: ...

    @property
    def state(self) -> EngineState: ...

    def start(self) -> None: ...

    def stop(self, drain_timeout_s: float = 0.0) -> None: ...

    def unload(self, timeout_s: float | None = 60.0) -> bool: ...  # free weights if idle (else False)

    def embed(self, inputs: Sequence[str | list[int]],  # raises typed errors
              truncate: bool = False) -> EmbedJobLike: ...

    def ensure_loaded(self, timeout_s: float | None = 300.0) -> bool: ...  # reload after an unload

    def set_keep_alive(self, keep_alive_s: float | None) -> None: ...  # None: never unload; 0: at once

    def residency_status(self) -> ResidencyStatus: ...

    def embedding_info(self) -> dict[str, Any]: ...  # model, n_embd, pooling, max_input_tokens
