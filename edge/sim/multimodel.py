"""Two resident models on one simulated box, as `edge serve`'s model host runs them.

`SimHost` is the one engine the scheduler turns (`edge.host.models.ModelHost` in the server):
the box's knobs are split among the busy models by the host's own rule
(`edge.host.share.share_knobs`: two busy models on two threads get one each, the same duty
cycle), its stats are the models' summed (`combined_stats`), its state `host_state`, and the
scheduler's eviction takes the least recently used idle model (`victim_for_memory`). The
baseline policies get no host: each model's engine takes the box's knobs whole, as two
servers (or a host that only counts models) would, and their threads compete for the cores.

`SimEmbedEngine` is the embedding model's engine. An embeddings batch is a prompt
evaluation over the model's weights, pooled (runtime/embed/): an input costs its tokens at
the calibration's measured prompt rate (`ThroughputModel.prefill_tokens_per_s`) for the
threads it runs with, under the same duty cycle, clock and contention as decoding. Assumed:
the embedding model is of the calibrated model's size (edge embeds with any GGUF, e.g. a
second SmolLM2-135M); no separate embeddings figure is measured. On the reference table
(132 prompt tokens/s on 2 threads, 71 on 1) the indexer's mean input of 88 tokens takes
0.67 s, 1.24 s on one thread. Its heat is that of a prompt: compute-bound, the largest
measured batch's utilisation.
"""

from __future__ import annotations

from collections.abc import Callable

from edge.contracts.engine import EngineState, EngineStats, Knobs
from edge.host.residency import ModelState, ModelView, victim_for_memory
from edge.host.share import combined_stats, host_state, share_knobs
from edge.runtime.step.plan import STEP_TOKEN_BUDGET
from edge.sim.engine import RELOAD_S, RELOAD_WARM_S, SimEngine, StepResult, compute_phases
from edge.sim.physics import DeviceLoad
from edge.sim.throughput import ThroughputModel
from edge.sim.workloads import SimRequest

EMBED_CTX_CELLS = 512  # the embedding model's own context (its KV beside the weights)


class SimEmbedEngine:
    """The embedding model's engine: queued requests in order, batch after batch."""

    def __init__(self, tp: ThroughputModel, knobs: Knobs, model_bytes: int, kv_bytes_per_cell: int) -> None:
        self.tp, self.knobs = tp, knobs
        self.bytes = model_bytes + kv_bytes_per_cell * EMBED_CTX_CELLS
        self.jobs: list[SimRequest] = []
        self.loaded, self.unloads = True, 0
        self.down_until_s: float | None = None
        self.running = False  # it embedded during the last tick (draws power)
        self.tokens = 0.0  # embedded so far
        self.inputs = self.requests = 0

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    @property
    def up(self) -> bool:
        return self.down_until_s is None

    def apply(self, knobs: Knobs) -> None:
        self.knobs = knobs

    def submit(self, req: SimRequest) -> None:
        self.jobs.append(req)

    def cancel(self, req: SimRequest) -> bool:
        if req in self.jobs:
            self.jobs.remove(req)
            return True
        return False

    def kill(self, now_s: float) -> list[SimRequest]:
        lost, self.jobs = self.jobs, []
        self.down_until_s = now_s + RELOAD_S
        return lost

    def unload(self) -> bool:
        if self.jobs or not self.up:
            return False
        self.unloads += 1 if self.loaded else 0
        self.loaded = False
        return True

    def resident_bytes(self) -> int:
        return self.bytes if self.up and self.loaded else 0

    def stats(self) -> EngineStats:
        """As the real engine reports embeddings: counters only, no sequences or KV cells."""
        state = EngineState.READY if self.up else EngineState.LOADING
        if self.up and not self.loaded:
            state = EngineState.UNLOADED
        elif self.up and self.knobs.paused:
            state = EngineState.PAUSED
        return EngineStats(state, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, self.knobs,
                           embed_batches=round(self.tokens / STEP_TOKEN_BUDGET), embed_inputs=self.inputs)

    def device_load(self) -> DeviceLoad:
        """A prompt's heat (compute-bound: the largest batch's) while it embeds, else none."""
        k = self.knobs
        if not self.running:
            return DeviceLoad(0, k.n_threads, 0.0)
        return DeviceLoad(self.tp.max_sequences, k.n_threads, k.duty, k.off_threads)

    def step(self, now_s: float, dt_s: float, clock_factor: float,
             free_cores: float | None) -> list[SimRequest]:
        """Embed for one tick; returns the requests finished."""
        self.running = False
        if not self.loaded and self.jobs:  # a request reloads the unloaded model
            self.loaded, self.down_until_s = True, now_s + RELOAD_WARM_S
        if self.down_until_s is not None:
            if now_s < self.down_until_s:
                return []
            self.down_until_s = None
        if not self.jobs or self.knobs.paused:
            return []
        self.running = True
        budget = sum(s * self.tp.prefill_tokens_per_s(t)
                     for t, s in compute_phases(self.knobs, dt_s, clock_factor, free_cores))
        done: list[SimRequest] = []
        while self.jobs and budget > 1e-9:
            job = self.jobs[0]
            take = min(budget, job.prompt_tokens - job.prefilled)
            job.prefilled += take
            budget -= take
            self.tokens += take
            if job.prompt_tokens - job.prefilled < 1e-6:
                job.prefilled, job.done = float(job.prompt_tokens), True
                self.inputs += job.inputs
                self.requests += 1
                done.append(self.jobs.pop(0))
        return done


class SimHost:
    """A chat model and an embedding model resident at once: one engine to the scheduler.

    With `share` (edge's policy) the busy models split the box's knobs (`share_knobs`), as
    `ModelHost` does; without it each takes them whole. Either way it records the threads
    the running models use against the knobs' `n_threads` (the allowance)."""

    def __init__(self, chat: SimEngine, embed: SimEmbedEngine, share: bool) -> None:
        self.chat, self.embed, self.share = chat, embed, share
        self.knobs = chat.knobs
        self.last_used_s = {"chat": 0.0, "embed": 0.0}
        self.threads_over_s = 0.0  # seconds the running models' threads exceeded the allowance
        self.max_threads = 0  # most threads the running models used at once
        self.both_busy_s = 0.0

    @classmethod
    def beside(cls, chat: SimEngine, model_bytes: int, kv_bytes_per_cell: int, share: bool) -> SimHost:
        """`chat` and an embedding model of `model_bytes` weights, both resident."""
        return cls(chat, SimEmbedEngine(chat.tp, chat.knobs, model_bytes, kv_bytes_per_cell), share)

    # --- the scheduler's engine --------------------------------------------
    def apply(self, knobs: Knobs) -> None:
        self.knobs = knobs
        self._share()

    def _share(self) -> None:
        """Each busy model gets its share of the box's knobs, an idle one the whole (as `ModelHost`)."""
        busy = self._busy()
        for e in (self.chat, self.embed):
            e.apply(share_knobs(self.knobs, len(busy)) if self.share and e in busy else self.knobs)

    def _busy(self) -> list[SimEngine | SimEmbedEngine]:
        """The models with requests in them (the host's leases)."""
        chat = [self.chat] if self.chat.waiting or self.chat.slots else []
        return chat + ([self.embed] if self.embed.busy else [])

    def stats(self) -> EngineStats:
        stats = [e.stats() for e in (self.chat, self.embed) if e.loaded]
        return combined_stats(stats, self.knobs, self.chat.n_slots, self.chat.kv_cells_total, self.state)

    @property
    def state(self) -> EngineState:
        return host_state([e.stats().state for e in (self.chat, self.embed) if e.loaded], not self.chat.up)

    def unload(self, timeout_s: float | None = 60.0) -> bool:
        """The scheduler's eviction: the least recently used idle model (the host's rule)."""
        busy = self._busy()
        views = [ModelView(name, ModelState.READY if e.loaded and e.up else ModelState.COLD,
                           e.resident_bytes(), 1 if e in busy else 0, self.last_used_s[name])
                 for name, e in (("chat", self.chat), ("embed", self.embed))]
        victim = victim_for_memory(views)
        return victim is not None and (self.chat if victim == "chat" else self.embed).unload()

    # --- what the harness drives -------------------------------------------
    def submit(self, req: SimRequest, on_start: Callable[[], None] | None = None) -> None:
        """A generation to the chat model; an embeddings request to the embedding model, whose
        ticket is never started (the API's embeddings claim waits in the queue until done)."""
        if req.inputs:
            self.embed.submit(req)
        else:
            self.chat.submit(req, on_start)

    def cancel(self, req: SimRequest) -> bool:
        return self.embed.cancel(req) if req.inputs else self.chat.cancel(req)

    def kill(self, now_s: float) -> list[SimRequest]:
        """The OOM killer takes the process: both models with it."""
        return self.chat.kill(now_s) + self.embed.kill(now_s)

    @property
    def up(self) -> bool:
        return self.chat.up

    @property
    def waiting(self) -> list[SimRequest]:
        return self.chat.waiting + self.embed.jobs

    @property
    def slots(self) -> list[SimRequest]:
        return self.chat.slots

    @property
    def unloads(self) -> int:
        return self.chat.unloads + self.embed.unloads

    @property
    def spec_drafted(self) -> float:
        return self.chat.spec_drafted

    @property
    def spec_accepted(self) -> float:
        return self.chat.spec_accepted

    def resident_bytes(self) -> int:
        return self.chat.resident_bytes() + self.embed.resident_bytes()

    def loads(self) -> tuple[DeviceLoad, ...]:
        return (*self.chat.loads(), self.embed.device_load())

    def step(self, now_s: float, dt_s: float, clock_factor: float,
             free_cores: float | None = None) -> StepResult:
        """One tick of both models; each finds the cores the other's threads hold taken."""
        self._share()  # the host shares again whenever a model turns busy or idle
        busy = self._busy()
        for name, e in (("chat", self.chat), ("embed", self.embed)):
            if e in busy:
                self.last_used_s[name] = now_s
        running = {id(e): e.knobs.n_threads for e in busy if e.up and e.loaded and not e.knobs.paused}
        used = sum(running.values())
        self.max_threads = max(self.max_threads, used)
        self.threads_over_s += dt_s if used > self.knobs.n_threads else 0.0
        self.both_busy_s += dt_s if len(running) == 2 else 0.0

        def free(other: SimEngine | SimEmbedEngine) -> float | None:
            return None if free_cores is None else max(0.0, free_cores - running.get(id(other), 0))

        res = self.chat.step(now_s, dt_s, clock_factor, free(self.embed))
        res.finished.extend(self.embed.step(now_s, dt_s, clock_factor, free(self.chat)))
        return res

    def metrics(self) -> dict[str, float | int]:
        """What the run shows of the two models: embeddings done, threads against the allowance."""
        embed = self.embed
        return {"unloads": self.unloads, "embed_inputs": embed.inputs, "embed_requests": embed.requests,
                "threads_over_allowance_s": round(self.threads_over_s, 2),
                "max_threads_in_use": self.max_threads, "both_busy_s": round(self.both_busy_s, 2)}
