"""`EngineConfig`: everything an `Engine` is built from, in one frozen value.

The runtime does not read settings, resolve model names or plan memory: the layer above it
(`edge.host`) does that once and hands the engine this record of plain facts (a validated
file, a context that fits, a resolved chat template). Tests and offline tools build one
directly; the defaults are the shared ones of `edge.contracts.options`. Importing this module
loads no native library.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from edge.contracts.options import (
    DEFAULT_DRAFT_MAX,
    DEFAULT_FLASH_ATTN,
    DEFAULT_N_BATCH,
    DEFAULT_N_CTX,
    DEFAULT_PROMPT_CACHE_MIB,
    DEFAULT_SLOTS,
    SPECULATIVE_MODES,
    STEP_TOKEN_BUDGET,
    FlashAttn,
    SpeculativeMode,
)
from edge.errors import ConfigError, InvalidRequest

if TYPE_CHECKING:
    from edge.runtime.text.chat_template import TemplateChoice


@dataclass(frozen=True)
class EngineConfig:
    """What one engine serves and how it is sized; checked here so a bad value fails at build.

    `n_threads` None: every CPU. `chat_template` replaces the model's own template (resolved by
    `edge.runtime.text.chat_template.resolve_chat_template`; None: the model's). `keep_alive_s`
    unloads the weights after that much idle time on the engine's clock (None: never);
    `idle_poll_s` is how often (real time) an idle engine thread looks at that timer.
    `step_token_budget` caps the tokens one step evaluates, bounding how long a long prompt can
    stall running streams. `speculative` is off unless asked for (the settings' default,
    ngram, comes through `edge.host`), so an engine built by hand is plain and repeatable.
    `flash_attn_off_fits`: the memory plan leaves room for the larger buffer of no flash
    attention (the plan itself stays with whoever built the engine: the runtime never reads it).
    """

    model_path: Path
    n_ctx: int = DEFAULT_N_CTX
    n_slots: int = DEFAULT_SLOTS
    n_threads: int | None = None
    n_batch: int = DEFAULT_N_BATCH
    kv_type: str = "f16"
    n_gpu_layers: int = 0
    step_token_budget: int = STEP_TOKEN_BUDGET
    chat_template: TemplateChoice | None = None
    keep_alive_s: float | None = None
    idle_poll_s: float = 1.0
    warmup: bool = True
    embedding_model: Path | None = None  # a second model for embeddings (None: the served one)
    speculative: SpeculativeMode = "off"
    draft_max: int = DEFAULT_DRAFT_MAX
    draft_model: Path | None = None  # --speculative draft's guesser (same vocabulary, checked above)
    flash_attn: FlashAttn = DEFAULT_FLASH_ATTN
    flash_attn_off_fits: bool = True
    prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_MIB << 20

    def __post_init__(self) -> None:
        # paths as Path whatever the caller passed (str from a CLI, Path from the store)
        for name in ("model_path", "embedding_model", "draft_model"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        if self.speculative not in SPECULATIVE_MODES:
            raise InvalidRequest(f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, "
                                 f"got {self.speculative!r}", "speculative")
        if self.speculative == "draft" and self.draft_model is None:
            raise ConfigError("speculative", "'draft' needs a draft model (--draft-model NAME)")
        if self.n_slots < 1 or self.n_ctx < 1 or self.n_batch < 1 or self.draft_max < 1:
            raise ConfigError("engine", f"n_slots, n_ctx, n_batch and draft_max must be >= 1: {self}")
        if self.n_threads is not None and self.n_threads < 1:
            raise ConfigError("threads", f"must be >= 1, got {self.n_threads}")

    @property
    def n_outputs(self) -> int | None:
        """Logits rows one batch may ask for: one per slot (None), or a verify row per draft token."""
        return None if self.speculative == "off" else self.n_slots * (1 + self.draft_max)

    @property
    def n_verify(self) -> int:
        """Rows of one sequence's speculative verify step (0: it never verifies)."""
        return 0 if self.speculative == "off" else self.draft_max + 1
