"""What the engine and its controllers hand each other: knobs in, stats and state out.

A leaf module (imports nothing of edge's), so the scheduler, the simulator and telemetry
name these types without importing the runtime, which would pull llama.cpp's world in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum


class Priority(IntEnum):
    """Smaller runs first. Interactive chat always goes before background jobs."""

    INTERACTIVE = 0
    BACKGROUND = 1


class EngineState(str, Enum):
    """Lifecycle of the engine; reported by /ready and /v1/status.

    LOADING -> READY <-> PAUSED; READY/PAUSED -> DRAINING -> STOPPED;
    any -> FAILED when the model cannot be loaded at start.
    READY/PAUSED -> UNLOADED when idle (keep-alive or `unload()`): weights and context are
    freed, only the vocabulary stays (tokenize and render_chat keep working); the next
    request reloads (LOADING, the request waits) -> READY. A failed reload fails the waiting
    requests with ModelLoadError and returns to UNLOADED, so a later request retries.
    """

    LOADING = "loading"
    READY = "ready"
    PAUSED = "paused"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"
    UNLOADED = "unloaded"


@dataclass(frozen=True)
class Knobs:
    """What the scheduler may turn while the engine runs; applied at the next step."""

    active_limit: int  # sequences decoding at once; surplus is parked (KV and output kept)
    n_threads: int
    duty: float = 1.0  # fraction of wall time spent stepping with n_threads, (0, 1]
    paused: bool = False  # no steps at all; KV kept
    admit_background: bool = True  # start new background sequences
    # the rest of the duty cycle: 0 idles between steps; k (< n_threads) steps with k threads instead
    off_threads: int = 0
    # speculative decoding allowed (the controller turns it off while it cuts load below full:
    # verifying guesses that fail spends energy on tokens thrown away)
    speculate: bool = True


@dataclass(frozen=True)
class EngineStats:
    """Snapshot after the last step, for the scheduler and /metrics."""

    state: EngineState
    step_time_s: float  # wall time of the last step (decode + sampling + bookkeeping)
    decode_time_s: float  # time inside llama_decode in the last step
    tokens_decoded: int  # generated tokens in the last step
    tokens_prefilled: int  # prompt tokens evaluated in the last step
    active: int  # sequences decoding
    parked: int  # admitted but held back by the active limit
    waiting: int  # not yet admitted to a slot
    waiting_interactive: int
    kv_cells_used: int
    kv_cells_total: int
    n_slots: int
    knobs: Knobs
    total_tokens_decoded: int = 0
    total_tokens_prefilled: int = 0
    total_steps: int = 0
    last_progress_s: float = 0.0  # monotonic time of the last finished step (watchdog)
    interactive_awaiting_first: int = 0  # interactive sequences in a slot that have no token yet
    embed_batches: int = 0  # embedding batches run (runtime/embed/), cumulative
    embed_inputs: int = 0  # inputs embedded, cumulative
    chat_steps_with_embed: int = 0  # decode steps that also ran an embedding batch (chat delayed)
    speculative: str = "off"  # the engine's mode: off, ngram, draft
    spec_drafted: int = 0  # draft tokens verified, cumulative
    spec_accepted: int = 0  # of those, accepted, cumulative
    spec_draft_len: float = 0.0  # mean draft length per decoding sequence in the last step
    flash_attn: bool | None = None  # the context's flash attention (None: llama.cpp's auto)
    prompt_cache_entries: int = 0  # idle prompt caches held in host memory (hostcache.py)
    prompt_cache_bytes: int = 0  # their size
    prompt_cache_restored: int = 0  # restored into a slot instead of evaluated again, cumulative
    attention: str = ""  # how that was chosen (setting, measured at load or on an earlier start, ...)
    # memory a load in flight is about to take (the model host's planned bytes of loading models):
    # not in MemAvailable yet, so the memory guard subtracts it
    loading_bytes: int = 0
