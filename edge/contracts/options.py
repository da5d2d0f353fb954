"""Option enums, defaults and request bounds, each defined once.

`Settings` (pydantic fields), the CLI (argparse `choices=`), the engine's defaults and
checks and the HTTP schemas (OpenAI's and Ollama's) all derive from these names, so a new
mode or a changed bound is one edit here and cannot drift between layers. A leaf module: it
imports nothing of edge's.
"""

from __future__ import annotations

from typing import Literal, get_args

# --- speculative decoding -----------------------------------------------------------------

SpeculativeMode = Literal["off", "ngram", "draft"]
SPECULATIVE_MODES: tuple[str, ...] = get_args(SpeculativeMode)
DEFAULT_SPECULATIVE: SpeculativeMode = "ngram"  # the settings' default (adaptive prompt lookup)
# Speculation's draft cap: a copied passage is often accepted whole 16 tokens at a time, and on a
# CPU a 17-token verify step cost 3.7x a one-token step against 2.4x for 9 (Qwen2.5 0.5B, 2-core
# Sapphire Rapids, no flash attention); the step plan picks shorter drafts wherever they pay more
DEFAULT_DRAFT_MAX = 16
DRAFT_MAX_LIMIT = 32  # the largest draft cap a setting may ask for

# --- flash attention ----------------------------------------------------------------------

FlashAttn = Literal["auto", "on", "off", "fastest"]
FLASH_ATTN_KINDS: tuple[str, ...] = get_args(FlashAttn)
DEFAULT_FLASH_ATTN: FlashAttn = "auto"  # llama.cpp's choice: repeatable greedy output

# --- sizes: the defaults of settings, engine, context and planner ---------------------------

DEFAULT_N_BATCH = 512  # tokens per llama_decode batch (and micro-batch)
DEFAULT_SLOTS = 4  # sequences that may share one batch
DEFAULT_N_CTX = 4096  # context where nothing else decides (no plan, no n_ctx_train in the GGUF)
STEP_TOKEN_BUDGET = 256  # tokens one step evaluates beside running streams
DEFAULT_PROMPT_CACHE_MIB = 256  # host memory for idle prompt caches moved out of the KV cache
# context per slot where the setting leaves it to the planner: a model host keeps several models
# resident, and a context sized to "all the memory there is" would leave none for the next one
DEFAULT_CTX_PER_SLOT = 4096

# --- the model host ---------------------------------------------------------------------------

DEFAULT_KEEP_ALIVE_S = 300.0  # an idle model unloads after 5 minutes, as Ollama's

# --- sampling and request bounds: what the engine enforces and both APIs declare ------------

# OpenAI documents temperature 0..2; above 2 a llama.cpp chain samples near-uniform noise, so
# the engine refuses it too and Ollama's route declares the same range (Ollama sets none).
TEMPERATURE_MAX = 2.0
REPEAT_PENALTY_MAX = 10.0  # > 0; 1 disables
PENALTY_ABS_MAX = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI
MAX_TOP_LOGPROBS = 20  # alternatives per token, as OpenAI

# --- thinking models: reasoning kept apart from the answer (llama-server's flag meanings) -----

# auto: the chat template's family; deepseek: think tags into reasoning; deepseek-legacy: also
# left in the content; none: no parsing, the text as the model wrote it
ReasoningFormat = Literal["auto", "none", "deepseek", "deepseek-legacy"]
REASONING_FORMATS: tuple[str, ...] = get_args(ReasoningFormat)
DEFAULT_REASONING_FORMAT: ReasoningFormat = "auto"
DEFAULT_REASONING_BUDGET = -1  # thinking tokens before edge closes the block itself; -1: unlimited
