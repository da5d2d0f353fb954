"""The engine as the harness models it: the engine's own step plan, at measured speed.

Admission to slots, activation (active / parked) and the batch of every step come from
`edge.runtime.step.plan.plan_step`, the function the real engine thread runs, over a view
of the simulated requests (the simulator caches no prompts, so no prefix is reused).
Each tick spends `dt * duty * clock` seconds of compute. A batch with prompt chunks runs
at the measured prefill rate for its tokens; a decode-only batch at the measured aggregate
rate for that many sequences and threads, repeated until a sequence finishes. Resident
memory grows with the KV cells in use (pages of the KV buffer are committed when first
written), which is what a memory hog competes with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from edge.contracts.engine import EngineState, EngineStats, Knobs, Priority
from edge.runtime.spec.rules import DraftAsk, expected_tokens
from edge.runtime.step.plan import (
    N_BATCH,
    STEP_TOKEN_BUDGET,
    SeqView,
    SlotState,
    SlotView,
    StepPlan,
    StepView,
    WaitView,
    admission_key,
    draft_room,
    plan_step,
    waiting_for_plan,
)
from edge.sim.physics import DeviceLoad
from edge.sim.throughput import ThroughputModel
from edge.sim.workloads import SimRequest

# Decode threads beyond the free cores wait at every op's barrier for a thread sharing its core
# with another busy process: measured 34 vs 115 tok/s (2 threads, SmolLM2, 2-core EPYC).
CONTENDED_SPEED = 0.3
RELOAD_S = 15.0  # time to restart and reload after the OOM killer took the engine
RELOAD_WARM_S = 1.0  # reload after an unload (measured 0.66-0.69 s for SmolLM2-135M)


@dataclass
class StepResult:
    finished: list[SimRequest] = field(default_factory=list)
    latencies: list[tuple[float, int]] = field(default_factory=list)  # (inter-token gap s, tokens)
    tokens: int = 0


class SimEngine:
    def __init__(self, throughput: ThroughputModel, n_slots: int, knobs: Knobs, model_bytes: int,
                 kv_bytes_per_cell: int, kv_cells_total: int, draft_max: int = 0) -> None:
        self.tp = throughput
        self.draft_max = draft_max  # speculative decoding: most tokens drafted per sequence (0: off)
        self.spec_drafted = self.spec_accepted = 0.0
        self.n_slots = n_slots
        self.knobs = knobs
        self.model_bytes = model_bytes
        self.kv_bytes_per_cell = kv_bytes_per_cell
        self.kv_cells_total = kv_cells_total
        self.waiting: list[SimRequest] = []
        self.slots: list[SimRequest] = []
        self.down_until_s: float | None = None
        self.loaded = True  # False after unload(); the next request reloads
        self.unloads = 0
        self.active_now = 0
        self.last_step_tokens = 0
        self.last_step_s = 0.0

    def apply(self, knobs: Knobs) -> None:
        self.knobs = knobs

    def submit(self, req: SimRequest, on_start: Callable[[], None] | None = None) -> None:
        """Queue a request; `on_start` is called when it takes a slot (as the real engine does)."""
        req.on_start = on_start
        self.waiting.append(req)

    def cancel(self, req: SimRequest) -> bool:
        for q in (self.waiting, self.slots):
            if req in q:
                q.remove(req)
                return True
        return False

    def kill(self, now_s: float) -> list[SimRequest]:
        """The OOM killer took the process: every request in it is gone, without an answer."""
        lost = self.waiting + self.slots
        self.waiting, self.slots = [], []
        self.down_until_s = now_s + RELOAD_S
        return lost

    @property
    def up(self) -> bool:
        return self.down_until_s is None

    def resident_bytes(self) -> int:
        if not self.up or not self.loaded:
            return 0
        return self.model_bytes + self.kv_bytes_per_cell * self.kv_cells_total

    @property
    def state(self) -> EngineState:
        return self.stats().state

    def unload(self, timeout_s: float | None = None) -> bool:
        """Free weights and KV; refused (False) while requests are queued or running."""
        if self.waiting or self.slots or not self.up:
            return False
        if self.loaded:
            self.loaded = False
            self.unloads += 1
        return True

    # --- the engine's step plan over the simulated requests --------------------------
    def _view(self, with_waiting: bool = True) -> StepView:
        by_slot = {r.seq_id: r for r in self.slots}
        slots = tuple(self._slot_view(i, by_slot.get(i)) for i in range(self.n_slots))
        running = tuple(SeqView(r.seq_id, _key(r), _prompt_left(r)) for r in self.slots)
        n_idle = self.n_slots - len(self.slots) if with_waiting else 0
        first = waiting_for_plan(self.waiting, n_idle, _key)  # the engine's rule, as for the engine
        waiting = tuple(WaitView(_key(r), r.prompt_tokens) for r in first)
        asks = tuple(DraftAsk(r.seq_id, draft_room(self.draft_max, self.kv_cells_total, r.kv_cells,
                                                   r.gen_tokens, int(r.generated)), r.accept_rate)
                     for r in self.slots if self.draft_max and r.accept_rate > 0 and _prompt_left(r) == 0)
        return StepView(self.kv_cells_total, N_BATCH, STEP_TOKEN_BUDGET, slots, running, waiting,
                        draft_asks=asks, step_cost=self._step_cost() if asks else ())

    def _batch_s(self, n_tokens: int, threads: int | None = None) -> float:
        """Seconds of a decode step of `n_tokens` (a verify step's tokens cost as many
        sequences' one token each: what calibration measured)."""
        return n_tokens / self.tp.decode_tokens_per_s(n_tokens, threads or self.knobs.n_threads)

    def _step_cost(self) -> tuple[tuple[int, float], ...]:
        n_max = self.n_slots * (1 + self.draft_max)
        return tuple((n, self._batch_s(n)) for n in range(1, n_max + 1))

    @staticmethod
    def _slot_view(i: int, req: SimRequest | None) -> SlotView:
        if req is None:
            return SlotView(i)
        state = SlotState.DECODE if _prompt_left(req) == 0 else SlotState.PREFILL
        return SlotView(i, state, 0, req.kv_cells)

    def _plan(self) -> StepPlan:
        """Plan a step and carry out its admissions (as the engine thread does)."""
        plan = plan_step(self._view(), self.knobs)
        for a in plan.admit:
            req = next(r for r in self.waiting if _key(r) == a.key)
            self.waiting.remove(req)
            req.seq_id = a.seq_id
            self.slots.append(req)
            if req.on_start is not None:
                req.on_start()
        return plan

    def stats(self) -> EngineStats:
        k = self.knobs
        state = EngineState.READY if self.up else EngineState.LOADING
        if self.up and not self.loaded:
            state = EngineState.UNLOADED
        if self.up and k.paused:
            state = EngineState.PAUSED
        n_wait_i = sum(1 for r in self.waiting if r.priority is Priority.INTERACTIVE)
        return EngineStats(
            state=state, step_time_s=self.last_step_s, decode_time_s=self.last_step_s,
            tokens_decoded=self.last_step_tokens, tokens_prefilled=0,
            active=self.active_now, parked=max(0, len(self.slots) - self.active_now),
            waiting=len(self.waiting), waiting_interactive=n_wait_i,
            kv_cells_used=sum(r.kv_cells for r in self.slots), kv_cells_total=self.kv_cells_total,
            n_slots=self.n_slots, knobs=k, speculative="ngram" if self.draft_max else "off",
            spec_drafted=int(self.spec_drafted), spec_accepted=int(self.spec_accepted),
            interactive_awaiting_first=sum(1 for r in self.slots
                                           if r.priority is Priority.INTERACTIVE and r.first_token_s is None),
        )

    def load(self) -> tuple[int, int, float, int]:
        """(active sequences, threads, duty, off-duty threads) for the device's power model."""
        if not self.up or self.knobs.paused or not self.loaded:
            return 0, self.knobs.n_threads, 0.0, 0
        return self.active_now, self.knobs.n_threads, self.knobs.duty, self.knobs.off_threads

    def metrics(self) -> dict[str, float | int]:
        """What a run reports of the engine itself."""
        return {"unloads": self.unloads}

    def loads(self) -> tuple[DeviceLoad, ...]:
        """Its work as the device's loads (`SimulatedDevice.set_loads`): one engine, one load."""
        return (DeviceLoad(*self.load()),)

    def step(self, now_s: float, dt_s: float, clock_factor: float,
             free_cores: float | None = None) -> StepResult:
        res = StepResult()
        if not self.loaded and self.up and self.waiting:
            self.loaded = True  # a request arrived while unloaded: reload (it waits meanwhile)
            self.down_until_s = now_s + RELOAD_WARM_S
        if self.down_until_s is not None:
            if now_s < self.down_until_s:
                self.active_now = 0
                return res
            self.down_until_s = None
        k = self.knobs
        plan = self._plan()
        active = [r for r in self.slots if r.seq_id in set(plan.active)]
        self.active_now = len(active)
        phases = compute_phases(k, dt_s, clock_factor, free_cores)
        mixed = k.off_threads > 0 and k.duty < 1.0
        # compute seconds per wall second
        speed = (clock_factor if mixed else k.duty * clock_factor) * contention(k.n_threads, free_cores)
        if not active or speed <= 0:
            self.last_step_tokens, self.last_step_s = 0, dt_s
            return res
        start_gen = {id(r): r.generated for r in active}
        first_at: dict[int, float] = {}
        elapsed_s = 0.0
        for threads, budget_s in phases:
            elapsed_s = self._compute(active, threads, elapsed_s, elapsed_s + budget_s, first_at)
        t_end = now_s + dt_s
        for req in active:
            n_new = int(req.generated) - int(start_gen[id(req)])
            if n_new <= 0:
                continue
            res.tokens += n_new
            if req.first_token_s is None:
                req.first_token_s = min(t_end, now_s + first_at.get(id(req), dt_s * speed) / speed)
                req.last_emit_s = req.first_token_s
                n_new -= 1
            if n_new > 0:
                gap = (t_end - (req.last_emit_s if req.last_emit_s is not None else t_end)) / n_new
                res.latencies.append((gap, n_new))
                req.last_emit_s = t_end
        for req in [r for r in self.slots if r.done]:
            self.slots.remove(req)
            res.finished.append(req)
        self.last_step_tokens, self.last_step_s = res.tokens, dt_s
        return res

    def _compute(self, active: list[SimRequest], threads: int, elapsed_s: float, end_s: float,
                 first_at: dict[int, float]) -> float:
        """Advance the active requests with `threads` from compute time `elapsed_s` to `end_s`,
        batch by batch as the engine's step plan composes them (admissions happen once a tick)."""
        prefill_tps = self.tp.prefill_tokens_per_s(threads)
        by_slot = {r.seq_id: r for r in active}
        while end_s - elapsed_s > 1e-9:
            plan = plan_step(self._view(with_waiting=False), self.knobs)
            chunks = [c for c in plan.chunks if c.seq_id in by_slot and not by_slot[c.seq_id].done]
            decoding = [by_slot[c.seq_id] for c in chunks if c.decode]
            prompts = [(by_slot[c.seq_id], c.n) for c in chunks if not c.decode]
            if not chunks:
                break
            left_s = end_s - elapsed_s
            if prompts:
                step_s = (sum(n for _, n in prompts) + len(decoding)) / prefill_tps
                frac = min(1.0, left_s / step_s)
                gain = {id(r): frac for r in decoding}
                for req, n in prompts:
                    req.prefilled = min(float(req.prompt_tokens), req.prefilled + n * frac)
                    if req.prompt_tokens - req.prefilled < 1e-6:
                        req.prefilled = float(req.prompt_tokens)
                        decoding.append(req)  # the step that ends a prompt samples its first token
                        gain[id(req)] = 1.0
                span_s = step_s * frac
            else:  # decode steps, each sequence with its planned draft (expected tokens per step)
                drafts = dict(plan.drafts)
                step_s = self._batch_s(len(decoding) + sum(drafts.values()), threads)
                per = {id(r): expected_tokens(r.accept_rate, drafts.get(r.seq_id, 0)) / step_s
                       for r in decoding}
                span_s = min(left_s, min((r.gen_tokens - r.generated) / per[id(r)] for r in decoding))
                span_s = max(span_s, 1e-6)
                gain = {id(r): per[id(r)] * span_s for r in decoding}
                steps = span_s / step_s
                self.spec_drafted += steps * sum(drafts.values())
                self.spec_accepted += sum(g - steps for g in gain.values()) if drafts else 0.0
            for req in decoding:
                g = gain[id(req)]
                before = req.generated
                req.generated = min(float(req.gen_tokens), before + g)
                if req.first_token_s is None and id(req) not in first_at and req.generated >= 1.0 and g > 0:
                    first_at[id(req)] = elapsed_s + span_s * min(1.0, (1.0 - before) / g)
                if req.gen_tokens - req.generated < 1e-6:
                    req.generated = float(req.gen_tokens)
                    req.done = True
            elapsed_s += span_s
        return elapsed_s


def contention(threads: int, free_cores: float | None) -> float:
    """Speed of `threads` threads when only `free_cores` cores are free (another process, or
    another resident model's engine, holds the rest): those beyond wait at every barrier."""
    return CONTENDED_SPEED if free_cores is not None and threads > free_cores + 0.5 else 1.0


def compute_phases(k: Knobs, dt_s: float, clock_factor: float,
                   free_cores: float | None) -> list[tuple[int, float]]:
    """(threads, compute seconds) a tick of `dt_s` gives: `duty` of it at n_threads, the rest
    at off_threads (or idle), each slowed by the clock and by contention for the cores."""
    phases = [(k.n_threads, dt_s * k.duty * clock_factor * contention(k.n_threads, free_cores))]
    if k.off_threads > 0 and k.duty < 1.0:
        phases.append((k.off_threads,
                       dt_s * (1.0 - k.duty) * clock_factor * contention(k.off_threads, free_cores)))
    return phases


def _key(req: SimRequest) -> tuple[int, int]:
    return admission_key(req.priority, req.rid)


def _prompt_left(req: SimRequest) -> int:
    return max(0, math.ceil(req.prompt_tokens - req.prefilled - 1e-6))
