"""The verify-step cost curve: measured once per model, build and threads, then read back.

The draft-length chooser (rules.choose_drafts) weighs expected tokens against what a step of
n tokens costs. Steps it never picked would stay guesses (interpolated), and on CPU the curve
is not smooth: ggml's repacked kernels take rows in fours, so a 4-token step can cost less
than a 3-token one (Qwen2.5 0.5B Q4_K on 2 cores: 77 vs 83 ms). So one sequence's verify
steps of 1..k+1 tokens are timed once, at CALIBRATE_DEPTH cells deep.

That costs 2(k+1) decodes (seconds on a small CPU), which must not stand between a start and
its first token: the curve comes from the probe cache (`probe_cache.py`, keyed by model file,
build, threads, attention kind, KV type and k) when an earlier start measured it; else it is
measured after ready, in the engine thread's idle turns, one decode per turn in a small
context of its own (the slots' prompt caches stay untouched), and then kept. What the engine
measures on real steps refines it either way (`StepCost.observe`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.llama.probe_cache import ProbeCache

CALIBRATE_DEPTH = 64  # KV cells before the timed steps
CALIBRATE_REPS = 2  # the fastest of these counts (a first run pays for cold caches)
KIND = "verify_cost"  # its answers' file in the probe cache


def curve_from_row(row: Mapping[str, object] | None, n_max: int) -> dict[int, float] | None:
    """A cached row as {tokens: seconds}; None unless it covers 1..n_max with positive numbers."""
    if row is None or not isinstance(row.get("by_n"), dict):
        return None
    try:
        curve = {int(n): float(s) for n, s in row["by_n"].items()}  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return None
    if any(curve.get(n, 0.0) <= 0.0 for n in range(1, n_max + 1)):
        return None
    return curve


def load_curve(cache: ProbeCache, key: str, n_max: int) -> dict[int, float] | None:
    return curve_from_row(cache.load(key), n_max)


def save_curve(cache: ProbeCache, key: str, curve: Mapping[int, float]) -> None:
    cache.save(key, {"by_n": {str(n): s for n, s in sorted(curve.items())}})


def measure_steps(model: LlamaModel, cfg: ContextConfig, n_max: int, out: dict[int, float],
                  depth: int = CALIBRATE_DEPTH, reps: int = CALIBRATE_REPS) -> Iterator[None]:
    """Time verify steps of 1..n_max tokens at `depth`, filling `out[n]` with the fastest of `reps`
    (sizes already in `out` are skipped: a run cut short resumes). Yields before each decode (engine
    thread: one decode per idle turn); `cfg` gives the threads, attention kind and KV type (its
    sizes are replaced). Closing the generator early frees its context."""
    todo = [n for n in range(1, n_max + 1) if n not in out]
    if not todo:
        return
    ctx = LlamaContext(model, ContextConfig(
        n_ctx=depth + n_max + 16, n_batch=max(depth, n_max), n_ubatch=max(depth, n_max), n_seq_max=1,
        n_threads=cfg.n_threads, kv_type=cfg.kv_type, flash_attn=cfg.flash_attn, n_outputs_max=n_max))
    batch = Batch(max(depth, n_max))
    filler = [model.bos_id if model.bos_id >= 0 else 0] * depth
    try:
        yield
        batch.add_prompt(0, filler, 0, logits_last=False)
        if batch.decode(ctx.ptr) != 0:
            raise RuntimeError("verify-cost calibration: llama_decode failed")
        for n in todo:
            best = float("inf")
            for _ in range(reps):
                yield
                batch.clear()
                batch.add_tokens(0, filler[:n], depth)
                t0 = time.perf_counter()
                rc = batch.decode(ctx.ptr)
                ctx.synchronize()
                best = min(best, time.perf_counter() - t0)
                ctx.seq_rm(0, depth, -1)
                if rc != 0:
                    raise RuntimeError(f"verify-cost calibration: llama_decode failed at {n} tokens")
            out[n] = best
    finally:
        batch.free()
        ctx.close()
