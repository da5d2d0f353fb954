"""Run scenarios x policies on the simulated device in simulated time, deterministically.

One run: clients send requests through `Admission` into the modelled engine;
the engine's load heats the RC device; the device's hardware throttle slows the
engine; a memory hog can push the engine into the OOM killer (the engine holds
its weights and whole KV cache while loaded, as llama.cpp does, so only
unloading gives memory back). Metrics count what users and the device experienced.

The `edge` policy is the production control path, not a copy of it: the shipped
telemetry `Monitor` reads the device (with a little seeded sensor noise) and the
shipped `SchedulerLoop` ticks on a manual clock at the periods it asks for,
deciding, turning the engine's knobs, feeding admission and evicting, with the
`ControllerConfig` that `edge serve` builds for the same device facts.
"""

from __future__ import annotations

import heapq
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from edge.clock import ManualClock
from edge.config import load_profile
from edge.contracts.device import DeviceProfile
from edge.contracts.engine import Knobs, Priority
from edge.errors import EdgeError
from edge.scheduler.admission import Admission, Ticket
from edge.scheduler.loop import ControlledEngine, SchedulerLoop
from edge.scheduler.state import ControllerConfig, config_for_device
from edge.sim.device import SimulatedDevice, SimulatedSource
from edge.sim.engine import SimEngine
from edge.sim.metrics import RunMetrics, weighted_percentile
from edge.sim.multimodel import SimHost
from edge.sim.policies import ConstantPolicy, Policy, ThresholdPolicy
from edge.sim.power import PowerPlan, PowerWindows
from edge.sim.throughput import ThroughputModel
from edge.sim.workloads import WORKLOADS, Client, SimRequest
from edge.telemetry.monitor import Monitor

SIM_LOG = logging.getLogger("edge.sim.scheduler")  # every decision change is logged at INFO:
SIM_LOG.setLevel(logging.WARNING)  # in simulated time that is thousands a second, so warnings only
DT_S = 0.25
BASELINE_CONTROL_PERIOD_S = 1.0  # the baseline policies look once a second; edge's loop says itself
N_SLOTS = 8
MAX_QUEUE = 64
SENSOR_NOISE_C = 0.15
USER_RETRY_AFTER_LOSS_S = 5.0
# Memory footprint of the measured model (SmolLM2-135M Q4_1, f16 KV): weights and bytes per KV cell
# = n_layer 30 x (n_embd_k_gqa 192 + n_embd_v_gqa 192) x 2 bytes; the whole cache (8 x 2048 cells,
# 360 MiB) is committed at load, as llama.cpp does.
MODEL_BYTES = 100 << 20
KV_BYTES_PER_CELL = 30 * (192 + 192) * 2
KV_CELLS_TOTAL = N_SLOTS * 2048
HOG_HEADROOM_BYTES = 96 << 20  # what the hog leaves beyond the weights: less than a loaded KV cache
POLICIES = ("none", "threshold", "edge")
PROFILES = ("jetson-orin-nano", "raspberry-pi-5")


@dataclass(frozen=True)
class Scenario:
    name: str
    workload: str
    description: str
    ambient_c: float | None = None  # None: the profile's ambient
    fan_fail_at: float | None = None  # fraction of the run; sink->ambient resistance x fan_factor
    fan_factor: float = 2.0
    neighbour_at: float | None = None  # fraction of the run when a busy process takes a core ...
    neighbour_until: float | None = None  # ... and when it exits
    hog_at: float | None = None  # fraction of the run when a memory hog appears ...
    hog_until: float | None = None  # ... and when it exits
    baseline_workload: str | None = None  # unloaded variant for the TTFT comparison
    power: PowerPlan | None = None  # budgets, battery, supply and sensor faults (sim/power.py)
    embed_model: bool = False  # an embedding model resident beside the chat model (multimodel.py)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("chat", "chat", "6 chat users, normal ambient"),
    Scenario("chat-hot", "chat", "6 chat users, 35 C ambient", ambient_c=35.0),
    Scenario("burst-hot", "burst", "bursts of 10 requests every 75 s + 1 user, 35 C", ambient_c=35.0),
    Scenario("background", "background", "batch job (4 streams) + 1 interactive user, 35 C",
             ambient_c=35.0, baseline_workload="interactive-only"),
    Scenario("fan-failure", "chat", "6 chat users; the fan fails a third of the way in", fan_fail_at=1 / 3),
    Scenario("memory-hog", "background", "batch job + 1 user; a memory hog takes RAM from 30% to 70%",
             hog_at=0.3, hog_until=0.7),
    Scenario("neighbour", "chat", "6 chat users; a busy process takes one core from 30% to 70%",
             neighbour_at=0.3, neighbour_until=0.7),
    Scenario("chat+embed-hot", "chat+embed", "2 models: 2 chat users on one, an indexer's embeddings on the "
             "other, 35 C", ambient_c=35.0, baseline_workload="chat+idle-embed", embed_model=True),
)}
# Power-limited scenarios and sensor faults (budgets as idle + frac x (max - idle) of the profile)
POWER_SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("power-7w", "background", "batch job + 1 user under --power-budget 7 (an Orin Nano's 7W mode)",
             power=PowerPlan(budget_w=7.0)),
    Scenario("unplugged", "background", "batch job + 1 user; unplugged at 30%: battery budget (30% of the "
             "range), the charge runs under the 20% reserve near the end", power=PowerPlan(
                 unplug_at=0.3, battery_frac=0.3)),
    Scenario("supply-sag", "chat", "6 chat users; from 40% the supply sags from 80% to 30% of the range "
             "over 2 min", power=PowerPlan(sag_at=0.4, sag_from_frac=0.8, sag_to_frac=0.3)),
    Scenario("rail-stuck", "chat", "6 chat users, budget 30% of the range; the power rail stops updating "
             "at a third", power=PowerPlan(budget_frac=0.3, rail_stuck_at=1 / 3)),
    Scenario("noisy-lag", "chat", "6 chat users, budget 30% of the range; power +-10% noise, temperature "
             "+-0.5 C, every reading 2 s late", power=PowerPlan(budget_frac=0.3, power_noise_frac=0.1,
                                                                temp_noise_c=0.5, lag_s=2.0)),
    Scenario("fan-stuck", "chat", "6 chat users; the fan fails at a third while its tachometer reading "
             "sticks at the healthy speed", power=PowerPlan(fan_stick_at=1 / 3)),
)}
SCENARIOS.update(POWER_SCENARIOS)


def make_policy(name: str, profile: DeviceProfile, tp: ThroughputModel, knobs: Knobs | None = None) -> Policy:
    """A baseline policy (`edge` is the production loop, see `control_loop`)."""
    full = Knobs(N_SLOTS, tp.max_threads, 1.0)
    if name == "none":
        return ConstantPolicy(full, "none")
    if name == "constant":
        return ConstantPolicy(knobs or full, "constant")
    if name == "threshold":
        return ThresholdPolicy(full, pause_c=profile.thermal_limit_c - 8.0, cooldown_s=30.0)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")


def controller_config(profile: DeviceProfile, tp: ThroughputModel) -> ControllerConfig:
    """What `edge serve` builds for this device (`config_for_device`): N_SLOTS slots, the
    throughput model's threads and decode table, the modelled footprint."""
    return config_for_device(N_SLOTS, tp.max_threads, profile, decode_tps=tp.decode_table(N_SLOTS),
                             footprint_bytes=MODEL_BYTES + KV_BYTES_PER_CELL * KV_CELLS_TOTAL)


def control_loop(source: SimulatedSource, engine: ControlledEngine, clock: ManualClock,
                 profile: DeviceProfile, config: ControllerConfig, admission: Admission) -> SchedulerLoop:
    """The production control path on a manual clock: the shipped Monitor and SchedulerLoop."""
    monitor = Monitor(source, clock=clock, profile=profile)
    return SchedulerLoop(monitor, engine, clock=clock, config=config, admission=admission, logger=SIM_LOG)


def _retry_after_s(err: EdgeError) -> float:
    """When a refused or shed simulated client tries again: the error's own Retry-After, else 10 s."""
    return err.retry_after_s if err.retry_after_s is not None else 10.0


class _Run:
    """State of one simulated run (kept in one object so the step loop stays readable)."""

    def __init__(self, scenario: Scenario, policy: str, profile: DeviceProfile, tp: ThroughputModel,
                 duration_s: float, seed: int, workload: str, knobs: Knobs | None = None,
                 config: ControllerConfig | None = None, draft_max: int = 0) -> None:
        self.sc, self.profile, self.duration_s = scenario, profile, duration_s
        self.plan = scenario.power or PowerPlan()
        self.windows = PowerWindows(DT_S)
        self.rng = random.Random(seed)
        self.clock = ManualClock()
        self.device = SimulatedDevice(profile, tp, order=2)
        self.plan.start(self.device, duration_s)
        if scenario.ambient_c is not None:
            self.device.ambient_c = self.device.die_c = self.device.sink_c = scenario.ambient_c
        guarded = policy == "edge"
        engine = SimEngine(tp, N_SLOTS, Knobs(N_SLOTS, tp.max_threads, 1.0), MODEL_BYTES, KV_BYTES_PER_CELL,
                           KV_CELLS_TOTAL, draft_max)
        self.engine: SimEngine | SimHost = engine if not scenario.embed_model else SimHost.beside(
            engine, MODEL_BYTES, KV_BYTES_PER_CELL, share=guarded)  # edge's host shares the knobs
        self.admission = Admission(
            MAX_QUEUE, stats_provider=self.engine.stats if guarded else None, n_slots=N_SLOTS,
            scheduled=guarded, clock=self.clock, reserve_bytes=profile.memory_reserve_bytes if guarded else 0)
        self.loop: SchedulerLoop | None = None
        self.policy: Policy | None = None
        self.source: SimulatedSource | None = None
        if guarded:
            plan = self.plan
            noise_c = plan.temp_noise_c if plan.temp_noise_c is not None else SENSOR_NOISE_C
            self.source = SimulatedSource(self.device, clock=self.clock, steps_device=False, noise_c=noise_c,
                                          seed=seed + 1,
                                          power_noise_frac=plan.power_noise_frac if plan.active else 0.0)
            cfg = config or controller_config(profile, tp)
            cfg = replace(cfg, power_budget_w=plan.setting_w(profile) or cfg.power_budget_w,
                          battery_power_budget_w=plan.battery_w(profile) or cfg.battery_power_budget_w)
            self.loop = control_loop(self.source, self.engine, self.clock, profile, cfg, self.admission)
        else:
            self.policy = make_policy(policy, profile, tp, knobs)
        self.clients: list[Client] = WORKLOADS[workload]()
        self.retries: list[tuple[float, int, SimRequest]] = []
        self.tickets: dict[int, Ticket] = {}
        self.next_rid = 0
        self.m = RunMetrics(scenario.name, policy, profile.name, duration_s)
        self.latencies: list[tuple[float, int]] = []
        self.ttfts: list[tuple[float, int]] = []

    # --- requests -------------------------------------------------------
    def _new(self, client: Client, t: float) -> SimRequest:
        self.next_rid += 1
        client.in_flight += 1
        return client.make(self.rng, self.next_rid, t)

    def _send(self, req: SimRequest, t: float) -> None:
        try:
            ticket = self.admission.admit(req.priority, *req.claim)
        except EdgeError as err:
            self.m.rejected_with_error += 1
            self._retry(req, t + _retry_after_s(err))
            return
        ticket.bind(lambda err, r=req: self._shed(r, err))
        self.tickets[req.rid] = ticket
        req.ticket = ticket
        req.prefilled = req.generated = 0.0
        self.engine.submit(req, on_start=ticket.start)  # as the real engine: started when it takes a slot

    def _retry(self, req: SimRequest, due_s: float) -> None:
        heapq.heappush(self.retries, (due_s, req.rid, req))

    def _shed(self, req: SimRequest, err: EdgeError) -> None:
        self.engine.cancel(req)
        self.tickets.pop(req.rid, None)
        self.m.shed_with_error += 1
        self._retry(req, self.clock.monotonic() + _retry_after_s(err))

    def _finish(self, req: SimRequest, t: float) -> None:
        ticket = self.tickets.pop(req.rid, None)
        if ticket is not None:
            ticket.release()
        self.m.tokens += req.gen_tokens
        self.m.completed += 1
        if req.priority is Priority.INTERACTIVE and req.first_token_s is not None:
            self.ttfts.append((req.first_token_s - req.first_try_s, 1))
        req.client.in_flight -= 1
        if req.client.closed_loop:
            req.client.due_s = t + req.client.think_s(self.rng)

    def _arrivals(self, t: float) -> None:
        for c in self.clients:
            if c.closed_loop:
                if c.in_flight == 0 and t >= c.due_s:
                    self._send(self._new(c, t), t)
            elif t >= c.due_s:
                for _ in range(c.burst):
                    self._send(self._new(c, t), t)
                c.due_s += c.period_s
        while self.retries and self.retries[0][0] <= t:
            _, _, req = heapq.heappop(self.retries)
            self._send(req, t)

    # --- conditions -----------------------------------------------------
    def _conditions(self, t: float) -> None:
        frac = t / self.duration_s
        sc, dev = self.sc, self.device
        if sc.fan_fail_at is not None:
            dev.resistance_factor = sc.fan_factor if frac >= sc.fan_fail_at else 1.0
        if sc.neighbour_at is not None:
            busy = sc.neighbour_at <= frac < (sc.neighbour_until if sc.neighbour_until is not None else 2.0)
            dev.set_neighbour(1.0 if busy else 0.0)
        if sc.hog_at is not None:
            until = sc.hog_until if sc.hog_until is not None else 2.0
            if sc.hog_at <= frac < until:
                full = dev.mem_total_bytes - dev.os_used_bytes - MODEL_BYTES - HOG_HEADROOM_BYTES
                ramp = min(1.0, (t - sc.hog_at * self.duration_s) / 20.0)
                dev.set_memory_hog(int(full * ramp))
            else:
                dev.set_memory_hog(0)
        self.plan.apply(dev, self.source, t, self.duration_s)

    def _control(self, t: float) -> float:
        """One control step; returns when the next one is due."""
        if self.loop is not None:
            self.loop.tick(t)  # monitor poll, decide, knobs, admission (shedding first), eviction
            return t + self.loop.interval_s()
        assert self.policy is not None
        sample = self.device.sample(t)
        self.engine.apply(self.policy.control(sample, self.admission.queue_state(), self.engine.stats()))
        return t + BASELINE_CONTROL_PERIOD_S

    def run(self, stop_when_unsafe: bool = False) -> RunMetrics:
        """Step the whole scenario; `stop_when_unsafe` ends it at the first OOM or hardware throttle."""
        n_steps = round(self.duration_s / DT_S)
        next_control_s = 0.0
        dev, eng, m = self.device, self.engine, self.m
        limit_c = self.profile.thermal_limit_c
        for i in range(n_steps):
            t = i * DT_S
            self.clock.set(t)
            self._conditions(t)
            self._arrivals(t)
            if t >= next_control_s:
                next_control_s = self._control(t) - 1e-9
            res = eng.step(t, DT_S, dev.clock_factor, dev.free_cores)
            for req in res.finished:
                self._finish(req, t + DT_S)
            self.latencies.extend(res.latencies)
            dev.set_loads(eng.loads())
            dev.set_engine_memory(eng.resident_bytes())
            dev.step(DT_S)
            if eng.up and dev.check_oom():
                m.oom_events += 1
                for req in eng.kill(t):
                    m.lost_without_error += 1
                    ticket = self.tickets.pop(req.rid, None)
                    if ticket is not None:
                        ticket.release()
                    self._retry(req, t + USER_RETRY_AFTER_LOSS_S)
                dev.set_engine_memory(0)
                if stop_when_unsafe:
                    break
            self.windows.add(dev.power_w, self.plan.budget_at(self.profile, t, self.duration_s))
            m.max_temp_c = max(m.max_temp_c, dev.temp_c)
            if dev.temp_c >= limit_c - 3.0:
                m.seconds_above_limit_minus_3 += DT_S
            if dev.hw_throttled:
                m.seconds_hw_throttled += DT_S
                if stop_when_unsafe:
                    break
        m.p50_token_latency_s = weighted_percentile(self.latencies, 0.5)
        m.p99_token_latency_s = weighted_percentile(self.latencies, 0.99)
        m.interactive_p99_ttft_s = weighted_percentile(self.ttfts, 0.99)
        m.unanswered_at_end = len(eng.waiting) + len(eng.slots) + len(self.retries)
        m.tokens += sum(int(r.generated) for r in eng.slots)  # streamed to users when the run stops
        m.extra.update(eng.metrics())  # unloads; with two models, embeddings and threads in use
        self._power_metrics()
        if self.loop is not None:
            m.extra["throttle_decisions"] = self.loop.state.mode.value
            m.extra["throttle_events"] = dict(self.loop.throttle_events)
            m.extra["reasoning_budget"] = self.loop.thinking_status()  # scheduler/reasoning.py's rule
        return m

    def _power_metrics(self) -> None:
        """Energy and tokens per joule always; the 10 s window ratios where a budget was in force."""
        m, dev, w = self.m, self.device, self.windows
        m.extra["energy_j"] = round(dev.energy_j, 1)
        m.extra["tokens_per_j"] = round(m.tokens / dev.energy_j, 3) if dev.energy_j > 0 else None
        m.extra["avg_power_w"] = round(dev.energy_j / self.duration_s, 3)
        if w.settled_windows or w.worst_transition:
            m.extra.update(worst_window_ratio=round(w.worst_settled, 4),
                           worst_transition_ratio=round(w.worst_transition, 4),
                           windows_over_budget=w.over_windows, max_10s_avg_power_w=round(w.max_avg_w, 3),
                           supply_over_s=round(dev.supply_over_s, 2))
        if dev.battery_pct is not None:
            m.extra["battery_end_pct"] = round(dev.battery_pct, 1)


def run_scenario(scenario: Scenario | str, policy: str, profile: str | DeviceProfile, tp: ThroughputModel,
                 duration_s: float = 1800.0, seed: int = 7, knobs: Knobs | None = None,
                 config: ControllerConfig | None = None, stop_when_unsafe: bool = False,
                 workload: str | None = None, draft_max: int = 0) -> RunMetrics:
    """`draft_max` > 0: the engine speculates (prompt lookup, up to that many tokens a step)
    as the step plan chooses, with each workload's acceptance (workloads.py)."""
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    prof = load_profile(profile) if isinstance(profile, str) else profile
    if policy not in (*POLICIES, "constant"):
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    run = _Run(sc, policy, prof, tp, duration_s, seed, workload or sc.workload, knobs, config, draft_max)
    m = run.run(stop_when_unsafe=stop_when_unsafe)
    if draft_max:
        m.extra["spec_drafted"] = round(run.engine.spec_drafted)
        m.extra["spec_accepted"] = round(run.engine.spec_accepted)
    if sc.baseline_workload and workload is None and policy == "edge":
        base = run_scenario(sc, policy, prof, tp, duration_s, seed, config=config,
                            workload=sc.baseline_workload)
        m.extra["unloaded_interactive_p99_ttft_s"] = base.interactive_p99_ttft_s
    return m


def sweep(scenario: Scenario | str, profile: str | DeviceProfile, tp: ThroughputModel,
          duration_s: float = 1800.0, seed: int = 7,
          progress: Callable[[str], None] | None = None, strict: bool = False,
          cache: dict[Knobs, RunMetrics] | None = None) -> tuple[Knobs | None, RunMetrics | None]:
    """Best constant (active x threads x duty x off-duty threads) that never throttles or OOMs, by tokens.

    With `strict`, the constant must also never come within 3 C of the limit: the
    safety line edge itself is held to, so the comparison is like for like. For
    each (active, threads, off-duty threads) the highest safe duty is found by bisection over a 0.1
    grid (heat rises with duty); `cache` shares runs between the two criteria.
    """
    cache = {} if cache is None else cache

    def safe(m: RunMetrics) -> bool:
        # under a budget, a constant must respect it too: every settled 10 s window <= budget + 5 %
        ok = m.seconds_hw_throttled == 0 and m.oom_events == 0
        ok = ok and m.extra.get("worst_window_ratio", 0) <= 1.05
        return ok and (not strict or m.seconds_above_limit_minus_3 == 0)

    duties = [round(0.1 * i, 1) for i in range(2, 11)]
    best: tuple[Knobs | None, RunMetrics | None] = (None, None)
    for threads, off in ((t, o) for t in range(1, tp.max_threads + 1) for o in range(t)):
        grid = duties[:-1] if off else duties  # duty 1 has no off-duty part: off = 0 covers it
        for active in sorted({1, 2, 3, 4, 6, N_SLOTS}):
            lo, hi, found = 0, len(grid) - 1, None
            while lo <= hi:
                mid = (lo + hi) // 2
                knobs = Knobs(active, threads, grid[mid], off_threads=off)
                if knobs not in cache:
                    cache[knobs] = run_scenario(scenario, "constant", profile, tp, duration_s, seed,
                                                knobs=knobs, stop_when_unsafe=True)
                m = cache[knobs]
                if safe(m):
                    found, lo = (knobs, m), mid + 1
                else:
                    hi = mid - 1
            if found is not None and (best[1] is None or found[1].tokens > best[1].tokens):
                best = found
                if progress:
                    progress(f"  best so far {found[0]}: {found[1].tokens} tokens")
    return best
