"""`edge bench engine`: the engine measured against what a user would otherwise run, side by side.

The baselines run in their OWN processes with the user's environment as it was
before edge touched it (`threads.user_env()`): a bare llama_decode loop
(`bare_loop.py`, imports nothing from edge, llama.cpp's default parameters) and,
when it has been built (`scripts/build_llamacpp_tools.sh`), llama.cpp's own
`llama-bench`. A baseline sharing edge's process would share its costs and
hide them. Figures, each a ratio taken in ONE run (rounds alternate baseline and
engine and keep the best of each, which is robust to transient interference):
  1. single-stream decode through the engine (sampling, detokenization, hand-off
     included) / the bare loop (target >= 0.95);
  2. aggregate decode of 4 concurrent streams / single stream (target >= 1.3),
     beside the same ratio of the bare loop;
  3. time to first token of a chat's second turn / first turn, with a ~1,000-token
     history (target <= 0.25: prefix reuse);
  4. Python overhead: wall time of a single-stream request minus time inside
     llama_decode and sampling, as a share of that wall time (target <= 3%);
  5. prompt tokens/s of a 512-token prompt through the engine / llama-bench pp512
     at the same threads and batch (target >= 0.9), and llama-bench tg128.
Both sides use greedy sampling with end-of-generation tokens banned, so every run
produces exactly the requested number of tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edge.runtime.engine.config import EngineConfig
from edge.runtime.engine.core import Engine
from edge.runtime.llama.backend import amx_kernels, probe_backends
from edge.runtime.llama.threads import user_env
from edge.runtime.types import GenerationRequest, SamplingParams

PROMPTS = (
    "The history of the printing press begins",
    "In a small village by the sea there lived",
    "The most important rule of software engineering is",
    "Photosynthesis is the process by which",
)
FILLER = (
    "Tell me about rivers, mountains and the weather in spring; describe how farmers plan "
    "their fields, which crops grow best, and why rain matters for every season. "
)
BARE_LOOP = Path(__file__).with_name("bare_loop.py")
TOOLS_BIN = Path(__file__).resolve().parents[2] / ".cache" / "llamacpp-tools" / "bin"
DEFAULT_LLAMA_BENCH = TOOLS_BIN / "llama-bench"  # scripts/build_llamacpp_tools.sh
PP_TOKENS = 512
Runner = Callable[[list[str]], str]  # argv -> stdout (a child process; tests inject a fake)


def run_child(argv: list[str]) -> str:
    """Run a baseline in its own process with the user's own environment; its stdout."""
    out = subprocess.run(argv, env=user_env(), capture_output=True, text=True, timeout=900, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name if argv[0] != sys.executable else argv[1]} failed "
                           f"({out.returncode}): {out.stderr.strip()[-400:]}")
    return out.stdout


@dataclass(frozen=True)
class BenchReport:
    model: str
    n_threads: int
    n_tokens: int
    bare_tok_s: float  # the bare loop, own process, llama.cpp defaults
    engine_tok_s: float
    engine_vs_bare: float  # target >= 0.95
    multi_tok_s: float
    multi_vs_single: float  # target >= 1.3
    bare_multi_vs_single: float  # the same ratio for the bare loop: what the machine allows
    ttft_first_s: float
    ttft_second_s: float
    ttft_ratio: float  # target <= 0.25
    history_tokens: int
    cached_tokens: int
    overhead_share: float  # target <= 0.03
    sample_share: float
    prefill_tok_s: float  # a 512-token prompt through the engine (submit -> first token)
    llama_bench_pp_tok_s: float | None = None  # llama-bench pp512, same threads and batch
    llama_bench_tg_tok_s: float | None = None  # llama-bench tg128
    prefill_vs_llama_bench: float | None = None  # target >= 0.9
    # one stream's step, in ms per step (means over the best round's steps): where it goes
    step_split_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> str:
        def mark(ok: bool) -> str:
            return "ok " if ok else "LOW"

        lines = [
            f"model {self.model}, {self.n_threads} threads, {self.n_tokens} tokens per stream",
            f"  bare llama_decode loop     {self.bare_tok_s:8.1f} tok/s   (own process, llama.cpp defaults)",
            f"  engine, 1 stream           {self.engine_tok_s:8.1f} tok/s   "
            f"x{self.engine_vs_bare:.3f} of bare   (>= 0.95) {mark(self.engine_vs_bare >= 0.95)}",
            f"  engine, 4 streams          {self.multi_tok_s:8.1f} tok/s   "
            f"x{self.multi_vs_single:.3f} of 1 stream (>= 1.3) {mark(self.multi_vs_single >= 1.3)}"
            f"   (bare loop: x{self.bare_multi_vs_single:.3f})",
            f"  TTFT turn 1 / turn 2       {self.ttft_first_s * 1e3:7.0f} / "
            f"{self.ttft_second_s * 1e3:.0f} ms"
            f"   x{self.ttft_ratio:.3f} (<= 0.25) {mark(self.ttft_ratio <= 0.25)}"
            f"   ({self.cached_tokens}/{self.history_tokens} history tokens reused)",
            f"  Python overhead per step   {self.overhead_share * 100:7.2f} %"
            f"   (<= 3%) {mark(self.overhead_share <= 0.03)}   sampling {self.sample_share * 100:.1f} %",
            f"  prompt, {PP_TOKENS} tokens         {self.prefill_tok_s:8.1f} tok/s",
        ]
        if self.step_split_ms:
            sp = self.step_split_ms
            lines.insert(-1, f"  one step, ms               {sp['step']:8.2f}   = llama_decode "
                         f"{sp['llama_decode']:.2f} + sampling {sp['sampling']:.2f} + step loop (Python) "
                         f"{sp['loop']:.2f} + delivery and wake-ups {sp['delivery']:.2f}   "
                         f"(bare loop {sp['bare']:.2f})")
        if self.llama_bench_pp_tok_s is not None and self.prefill_vs_llama_bench is not None:
            ratio = self.prefill_vs_llama_bench
            lines[-1] += (f"   x{ratio:.3f} of llama-bench pp{PP_TOKENS} "
                          f"{self.llama_bench_pp_tok_s:.1f} (>= 0.9) {mark(ratio >= 0.9)}")
            lines.append(f"  llama-bench tg128          {self.llama_bench_tg_tok_s or 0.0:8.1f} tok/s")
        else:
            lines[-1] += "   (llama-bench not built: scripts/build_llamacpp_tools.sh)"
        return "\n".join(lines)


def bare_decode(model_path: str | Path, n_tokens: int, n_threads: int, n_seqs: int = 1,
                runner: Runner = run_child) -> float:
    """Aggregate decode tokens/s of the bare loop, in its own process."""
    argv = [sys.executable, str(BARE_LOOP), str(model_path), "--tokens", str(n_tokens),
            "--threads", str(n_threads), "--seqs", str(n_seqs), "--prompt", PROMPTS[0]]
    if amx_kernels(probe_backends().system_info):  # they crash; otherwise llama.cpp's default
        argv.append("--no-extra-buffers")
    return float(json.loads(runner(argv).strip().splitlines()[-1])["tok_s"])


def llama_bench(binary: Path, model_path: str | Path, n_threads: int,
                runner: Runner = run_child) -> tuple[float, float]:
    """(pp512, tg128) tokens/s from llama.cpp's own llama-bench, same threads, batch 512."""
    argv = [str(binary), "-m", str(model_path), "-t", str(n_threads), "-p", str(PP_TOKENS), "-n", "128",
            "-b", "512", "-ub", "512", "-r", "3", "-o", "json"]
    if amx_kernels(probe_backends().system_info):  # it segfaults on AMX builds, like the engine would
        argv += ["--repack", "0"]
    out = runner(argv)
    rows = json.loads(out)
    pp = next(r["avg_ts"] for r in rows if r.get("n_prompt") == PP_TOKENS and not r.get("n_gen"))
    tg = next(r["avg_ts"] for r in rows if r.get("n_gen") == 128 and not r.get("n_prompt"))
    return float(pp), float(tg)


def _stream_times(
    engine: Engine, prompts: tuple[str, ...], n_tokens: int, sp: SamplingParams
) -> list[list[tuple[float, int]]]:
    """Run `prompts` concurrently; per stream, (arrival time, tokens) of every event."""
    handles = [engine.submit(GenerationRequest(p, max_tokens=n_tokens + 1, sampling=sp)) for p in prompts]
    out: list[list[tuple[float, int]]] = [[] for _ in handles]

    def read(i: int) -> None:
        for ev in handles[i]:
            out[i].append((time.perf_counter(), ev.n_tokens))

    readers = [threading.Thread(target=read, args=(i,)) for i in range(len(handles))]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    return out


def _decode_rate(streams: list[list[tuple[float, int]]]) -> float:
    """Tokens/s while every stream is decoding: from the last first-token to the first finish."""
    t_start = max(s[0][0] for s in streams)
    t_end = min(s[-1][0] for s in streams)
    n = sum(k for s in streams for t, k in s if t_start < t <= t_end)
    return n / (t_end - t_start) if t_end > t_start else 0.0


def _ttft_pair(engine: Engine, history_tokens: int) -> tuple[float, float, int, int]:
    nonce = uuid.uuid4().hex[:8]  # a cold first turn: no cached prefix from earlier runs
    msgs: list[dict[str, Any]] = [{"role": "system", "content": f"Session {nonce}. You are helpful."}]
    while len(engine.tokenize(engine.render_chat(msgs), add_bos=False)) < history_tokens:
        msgs += [{"role": "user", "content": FILLER}, {"role": "assistant", "content": FILLER}]
    msgs.append({"role": "user", "content": "Summarize that in one line."})
    sp = SamplingParams(temperature=0.0)

    def ttft(prompt: str) -> tuple[float, str, int]:
        t0 = time.perf_counter()
        h = engine.submit(GenerationRequest(prompt, max_tokens=8, sampling=sp, add_bos=False))
        first = -1.0
        parts = []
        cached = 0
        for ev in h:
            if first < 0:
                first = time.perf_counter() - t0
            parts.append(ev.text)
            if ev.usage is not None:
                cached = ev.usage.cached_tokens
        return first, "".join(parts), cached

    p1 = engine.render_chat(msgs)
    t1, answer, _ = ttft(p1)
    msgs += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks. One more?"}]
    t2, _, cached = ttft(engine.render_chat(msgs))
    return t1, t2, len(engine.tokenize(p1, add_bos=False)), cached


def _prefill_rate(engine: Engine, n_tokens: int) -> float:
    """Prompt tokens/s of one fresh `n_tokens`-token prompt: submit -> first token."""
    nonce = uuid.uuid4().hex[:8]  # nothing cached from an earlier run
    ids = engine.tokenize(f"{nonce} " + FILLER * 64)[:n_tokens]
    t0 = time.perf_counter()
    h = engine.submit(GenerationRequest(ids, max_tokens=1, sampling=SamplingParams(temperature=0.0)))
    for _ in h:
        pass
    return len(ids) / (time.perf_counter() - t0)


def run_bench(
    model_path: str | Path, n_threads: int = 2, n_tokens: int = 128, rounds: int = 2,
    llama_bench_path: Path | None = DEFAULT_LLAMA_BENCH, runner: Runner = run_child,
) -> BenchReport:
    """Every figure of the module docstring in one run: prompts, single stream, four streams, TTFT."""
    # serve's step budget; 2048 cells a slot (a sliding-window model's slot holds n_ctx / n_slots)
    config = EngineConfig(Path(model_path), n_ctx=8192, n_slots=4, n_threads=n_threads)
    engine = Engine(config)
    engine.start()
    engine.wait_for_probes(600.0)  # probes measured after ready would run beside the baselines
    assert engine.model is not None
    lb = llama_bench_path if llama_bench_path is not None and llama_bench_path.is_file() else None
    try:
        sp = SamplingParams(temperature=0.0,
                            logit_bias={t: float("-inf") for t in engine.model.eog_tokens()})
        _stream_times(engine, PROMPTS[:1], 8, sp)  # warm-up
        # prompts first, while the cache holds little else: llama-bench's pp512 runs on a fresh
        # context, and other slots' cached prompts make every batch attend over more cells
        prefill, pp, tg = _prefill_rounds(engine, model_path, n_threads, rounds, lb, runner)
        bare, single, overhead, sample_share, split = _single_rounds(engine, model_path, n_threads, n_tokens,
                                                                     rounds, sp, runner)
        multi = bare_multi = 0.0
        for _ in range(rounds):
            bare_multi = max(bare_multi, bare_decode(model_path, n_tokens, n_threads, 4, runner=runner))
            multi = max(multi, _decode_rate(_stream_times(engine, PROMPTS, n_tokens, sp)))
        t1, t2, hist, cached = _ttft_pair(engine, 1000)
    finally:
        engine.stop()
    return BenchReport(
        model=Path(model_path).name,
        n_threads=n_threads,
        n_tokens=n_tokens,
        bare_tok_s=bare,
        engine_tok_s=single,
        engine_vs_bare=single / bare if bare else 0.0,
        multi_tok_s=multi,
        multi_vs_single=multi / single if single else 0.0,
        bare_multi_vs_single=bare_multi / bare if bare else 0.0,
        ttft_first_s=t1,
        ttft_second_s=t2,
        ttft_ratio=t2 / t1 if t1 > 0 else 0.0,
        history_tokens=hist,
        cached_tokens=cached,
        overhead_share=overhead,
        sample_share=sample_share,
        step_split_ms=split,
        prefill_tok_s=prefill,
        llama_bench_pp_tok_s=pp,
        llama_bench_tg_tok_s=tg,
        prefill_vs_llama_bench=prefill / pp if pp else None,
    )


def _prefill_rounds(engine: Engine, model_path: str | Path, n_threads: int, rounds: int,
                    lb: Path | None, runner: Runner) -> tuple[float, float | None, float | None]:
    """Best engine prompt rate, and llama-bench's pp512 and tg128 when it is built, over `rounds`."""
    pp = tg = None
    prefill = 0.0
    for _ in range(rounds):
        if lb is not None:
            got = llama_bench(lb, model_path, n_threads, runner=runner)
            pp, tg = max(pp or 0.0, got[0]), max(tg or 0.0, got[1])
        prefill = max(prefill, _prefill_rate(engine, PP_TOKENS))
    return prefill, pp, tg


def _single_rounds(engine: Engine, model_path: str | Path, n_threads: int, n_tokens: int, rounds: int,
                   sp: SamplingParams, runner: Runner) -> tuple[float, float, float, float, dict[str, float]]:
    """Best bare-loop and engine single-stream rates, alternating; with the engine's best round, the
    share of its wall time outside llama_decode and sampling, the share spent sampling, and a
    step's milliseconds split: llama_decode, sampling, the rest of the step loop (planning, the
    batch, commits), and what lies between steps (events to the consumer, wake-ups, the engine
    thread's turn); the bare loop's step beside it."""
    bare = single = 0.0
    overhead = sample_share = 1.0
    split: dict[str, float] = {}
    for _ in range(rounds):
        bare = max(bare, bare_decode(model_path, n_tokens, n_threads, runner=runner))
        engine.perf.reset()
        t0 = time.perf_counter()
        streams = _stream_times(engine, PROMPTS[:1], n_tokens, sp)
        wall = streams[0][-1][0] - t0  # submit -> final event, everything included
        rate = _decode_rate(streams)
        perf = engine.perf
        share = (wall - perf.decode_s - perf.sample_s) / wall
        if rate > single and perf.steps:
            single, overhead, sample_share = rate, share, perf.sample_s / wall
            n, ms = perf.steps, 1e3
            split = {"step": ms / rate, "llama_decode": perf.decode_s * ms / n,
                     "sampling": perf.sample_s * ms / n,
                     "loop": (perf.step_s - perf.decode_s - perf.sample_s) * ms / n}
            split["delivery"] = max(0.0, split["step"] - perf.step_s * ms / n)
    if split:
        split["bare"] = 1e3 / bare if bare else 0.0
    return bare, single, overhead, sample_share, split
