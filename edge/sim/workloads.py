"""Deterministic clients that generate requests in simulated time.

Closed-loop clients (chat users, a batch job) send a request, wait for it to
finish, think, and send the next; rejected requests are retried after the
server's Retry-After, like a well-behaved client. Open-loop bursts arrive on a
schedule regardless. All randomness comes from one seeded generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from edge.contracts.engine import Priority


@dataclass
class SimRequest:
    """One request as the harness tracks it."""

    rid: int
    client: Client
    priority: Priority
    prompt_tokens: int
    gen_tokens: int  # tokens it will generate before stopping
    first_try_s: float  # when the user first asked (TTFT counts from here, retries included)
    prefilled: float = 0.0
    generated: float = 0.0
    first_token_s: float | None = None
    last_emit_s: float | None = None
    done: bool = False
    ticket: object | None = None
    on_start: Callable[[], None] | None = None  # admission's ticket.start, called when it takes a slot
    seq_id: int = -1  # the engine slot it holds (-1: none)
    accept_rate: float = 0.0  # chance a prompt-lookup guess of its next token holds (speculation)
    inputs: int = 0  # an embeddings request: its inputs (prompt_tokens all of them; 0: a generation)

    @property
    def kv_cells(self) -> int:
        return int(self.prefilled) + int(self.generated)

    @property
    def claim(self) -> tuple[int, int]:
        """(prompt tokens, max tokens) it claims at admission: an embeddings request claims none
        of the generation KV cache (its context is its own), as the API admits it."""
        return (0, 0) if self.inputs else (self.prompt_tokens, self.client.gen_range[1])


@dataclass
class Client:
    """A source of requests; `due_s` is when it next wants to send."""

    name: str
    priority: Priority
    prompt_range: tuple[int, int]
    gen_range: tuple[int, int]
    think_range_s: tuple[float, float] = (0.0, 0.0)
    closed_loop: bool = True
    period_s: float = 0.0  # open loop: one burst every period
    burst: int = 1
    start_s: float = 0.0
    due_s: float = 0.0
    pending: list[float] = field(default_factory=list)  # open loop: first-try times awaiting a send
    in_flight: int = 0
    accept_rate: float = 0.0  # of its answers' tokens, guessed from the prompt (speculative decoding)

    def __post_init__(self) -> None:
        self.due_s = self.start_s

    def make(self, rng: random.Random, rid: int, first_try_s: float) -> SimRequest:
        return SimRequest(rid, self, self.priority, rng.randint(*self.prompt_range),
                          rng.randint(*self.gen_range), first_try_s, accept_rate=self.accept_rate)

    def think_s(self, rng: random.Random) -> float:
        lo, hi = self.think_range_s
        return rng.uniform(lo, hi)


@dataclass
class EmbedClient(Client):
    """Embeddings requests of `inputs` inputs, each of `prompt_range` tokens; nothing generated."""

    inputs: int = 8

    def make(self, rng: random.Random, rid: int, first_try_s: float) -> SimRequest:
        tokens = sum(rng.randint(*self.prompt_range) for _ in range(self.inputs))
        return SimRequest(rid, self, self.priority, tokens, 0, first_try_s, inputs=self.inputs)


# Per-token acceptance of prompt-lookup guesses, from edge's own counters on the bench's
# workloads (Qwen2.5 0.5B, greedy): code rewritten 0.80, a summary that quotes its document
# ~0.6; free-form chat guesses rarely hold. Used only when the simulation speculates.
CHAT_ACCEPT = 0.15
SUMMARY_ACCEPT = 0.6


def chat_users(n: int, think_s: tuple[float, float] = (3.0, 8.0), start_s: float = 0.0) -> list[Client]:
    """Interactive users chatting continuously: medium prompts, medium answers."""
    return [Client(f"chat{i}", Priority.INTERACTIVE, (60, 250), (120, 360), think_s,
                   start_s=start_s + 0.7 * i, accept_rate=CHAT_ACCEPT) for i in range(n)]


def bursts(period_s: float = 120.0, size: int = 8, start_s: float = 5.0) -> list[Client]:
    """Open-loop bursts of interactive requests (a team hitting the box at once)."""
    return [Client("burst", Priority.INTERACTIVE, (80, 300), (150, 400), closed_loop=False,
                   period_s=period_s, burst=size, start_s=start_s)]


def batch_job(concurrency: int = 4, start_s: float = 0.0) -> list[Client]:
    """A background job (summarising documents): long prompts, long outputs, no think time."""
    return [Client(f"batch{i}", Priority.BACKGROUND, (300, 600), (300, 500), (0.2, 0.5),
                   start_s=start_s + 0.3 * i, accept_rate=SUMMARY_ACCEPT) for i in range(concurrency)]


def indexer(inputs: int = 8, start_s: float = 1.0) -> list[Client]:
    """A background indexer for a local Q&A box: embeddings of document chunks (48-128 tokens
    each, `inputs` per request), one request after another."""
    return [EmbedClient("indexer", Priority.BACKGROUND, (48, 128), (0, 0), (0.5, 2.0), start_s=start_s,
                        inputs=inputs)]


WORKLOADS = {
    "chat": lambda: chat_users(6),
    "burst": lambda: bursts(period_s=75.0, size=10) + chat_users(1, think_s=(6.0, 12.0)),
    "background": lambda: batch_job(4) + chat_users(1, think_s=(8.0, 15.0), start_s=2.0),
    "interactive-only": lambda: chat_users(1, think_s=(8.0, 15.0), start_s=2.0),
    # two resident models (Scenario.embed_model): chat users on one, the indexer on the other
    "chat+embed": lambda: chat_users(2, think_s=(5.0, 12.0)) + indexer(),
    "chat+idle-embed": lambda: chat_users(2, think_s=(5.0, 12.0)),  # the same users, no embeddings
}
