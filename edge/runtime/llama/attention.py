"""Flash attention or not, with `--flash-attn fastest`: both timed on this device, once per model,
build and threads.

llama.cpp's own `auto` turns flash attention on wherever the backend has the kernel. On a GPU
that is the fast path; on a CPU it depends on the CPU. On a 2-core Sapphire Rapids VM (Qwen2.5
Coder 0.5B Q4_K_M, 2 threads, llama-bench at depth 300 / 1000) it made a one-token step 13 % /
20 % slower and an 8-token verify step 26 % slower, while prompts ran 9 % faster. A runtime that
knows its device measures instead of guessing: on the engine thread, in idle turns after the
engine is ready (one probe decode per turn, so a request waits one decode at most), a small
context of each kind evaluates a prompt chunk, one-token steps and (with speculation) a verify
step; the kind whose nominal request (`request_s`) is cheaper wins, and the engine's context is
remade with it if it is not the one it started with. The verdict is kept in the probe cache
(probe_cache.py) so later starts open with it and measure nothing.

Why it is opt-in (`auto` is llama.cpp's choice, on for a CPU): without flash attention the
CPU backend multiplies K·Q with llamafile's tinyBLAS for a batch of two or more rows and with
ggml's own dot product for one row (sgemm.cpp: "only enable sgemm for prompt processing"), so
a token's logits depend on how it was batched. Greedy output then changes with speculation (a
verify step batches the draft) and with prompt-cache hits (a cached prompt's last token is
evaluated alone): on SmolLM2 the same chat request at temperature 0 answered differently the
second time. With flash attention one-row and n-row batches run the same per-row kernel (up to
ggml's KV split of one-query batches past 512 cells). Repeatable answers are the default; the
faster kind, where it is faster, is a choice the user makes knowing that.

Only where the choice is free: CPU-only weights, an f16 KV cache (a quantized V cache needs
flash attention) and a memory plan that fits without it (without flash attention the compute
buffer holds the whole K·Q matrix). Elsewhere the setting's `on`/`off`, or llama.cpp's auto.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from edge.contracts.options import FlashAttn
from edge.runtime.llama.batch import Batch
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
from edge.runtime.llama.probe_cache import ProbeCache, probe_key

log = logging.getLogger("edge.engine")

PROBE_CHUNK = 128  # prompt tokens per probe batch
PROBE_DEPTH = 384  # prompt tokens evaluated (timed) before the timed steps, in PROBE_CHUNK batches
PROBE_STEPS = 4  # one-token steps timed at that depth (the fastest counts)
NOMINAL_PROMPT = 256  # the nominal request the kinds are compared on: new prompt tokens ...
NOMINAL_STEPS = 128  # ... and decode steps (half of them verify steps where speculation is on)
KIND = "attention"  # its answers' file in the probe cache
VERDICTS_FILE = f"{KIND}.json"


@dataclass(frozen=True)
class AttnTiming:
    """Measured seconds of one kind of attention on this device."""

    flash_attn: bool
    prompt_token_s: float  # per prompt token, over PROBE_DEPTH tokens in PROBE_CHUNK batches
    step_s: float  # a one-token step at depth PROBE_DEPTH
    verify_s: float = 0.0  # a verify step of n_verify tokens (0: not speculating)

    def request_s(self) -> float:
        """A nominal request: NOMINAL_PROMPT new prompt tokens, then NOMINAL_STEPS steps (half of
        them verify steps where speculation is on)."""
        step_s = (self.step_s + self.verify_s) / 2 if self.verify_s else self.step_s
        return NOMINAL_PROMPT * self.prompt_token_s + NOMINAL_STEPS * step_s


OFF_MARGIN = 0.97  # without flash attention must be 3 % cheaper: it holds a larger compute buffer


def choose(on: AttnTiming, off: AttnTiming) -> AttnTiming:
    """The cheaper kind for the nominal request; near a tie, flash attention (llama.cpp's
    default, and the smaller compute buffer)."""
    return off if off.request_s() < OFF_MARGIN * on.request_s() else on


def free_choice(setting: FlashAttn, n_gpu_layers: int, kv_type: str, off_fits: bool) -> bool:
    """Whether edge measures and chooses (else `fixed_choice` holds)."""
    return setting == "fastest" and n_gpu_layers == 0 and kv_type == "f16" and off_fits


def fixed_choice(setting: FlashAttn) -> bool | None:
    """The context parameter for a setting edge does not measure (None: llama.cpp's auto; also
    `fastest` where the choice is not free)."""
    return {"on": True, "off": False}.get(setting)


def measure(model: LlamaModel, n_threads: int, flash_attn: bool, n_verify: int = 0) -> AttnTiming:
    """Time one kind at once (see `probe`)."""
    steps = probe(model, n_threads, flash_attn, n_verify)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def probe(model: LlamaModel, n_threads: int, flash_attn: bool,
          n_verify: int = 0) -> Generator[None, None, AttnTiming]:
    """Time one kind on a small context of its own, yielding after each decode so the engine
    thread can run it in idle turns (a request waits one probe decode at most); the timing is
    the generator's return value. Closing it early frees the context.

    The steps are timed PROBE_DEPTH cells deep: how the kinds compare moves with the depth (on
    the CPU above, a one-token step costs the same both ways at 128 cells, 14 % more with flash
    attention at 300 and 27 % more at 1000; a 9-token verify step 13 % / 33 % / 100 % more)."""
    n_rows = max(1, n_verify)
    ctx = LlamaContext(model, ContextConfig(n_ctx=PROBE_DEPTH + 2 * n_rows + 16, n_batch=PROBE_CHUNK,
                                            n_ubatch=PROBE_CHUNK, n_seq_max=1, n_threads=n_threads,
                                            flash_attn=flash_attn, n_outputs_max=n_rows))
    batch = Batch(PROBE_CHUNK)
    toks = [(i * 7919) % max(1, model.n_vocab - 10) + 5 for i in range(PROBE_DEPTH)]

    def run(tokens: Sequence[int], pos: int, prompt: bool = False) -> float:
        batch.clear()
        if prompt:
            batch.add_prompt(0, tokens, pos, logits_last=True)
        else:
            batch.add_tokens(0, tokens, pos)
        t0 = time.perf_counter()
        if batch.decode(ctx.ptr) != 0:
            raise RuntimeError("attention probe: llama_decode failed")
        ctx.synchronize()
        elapsed = time.perf_counter() - t0
        if not prompt:
            ctx.seq_rm(0, PROBE_DEPTH, -1)
        return elapsed

    try:
        ctx.warm_up(model)
        prompt_s = 0.0
        for p in range(0, PROBE_DEPTH, PROBE_CHUNK):
            yield
            prompt_s += run(toks[p : p + PROBE_CHUNK], p, prompt=True)
        steps = [toks[:1]] * PROBE_STEPS
        verifies = [toks[:n_verify]] * 2 if n_verify > 1 else []
        step_s = verify_s = float("inf")
        for i, tokens in enumerate(steps + verifies):
            yield
            s = run(tokens, PROBE_DEPTH)
            if i < len(steps):
                step_s = min(step_s, s)
            else:
                verify_s = min(verify_s, s)
        return AttnTiming(flash_attn, prompt_s / PROBE_DEPTH, step_s, verify_s if verifies else 0.0)
    finally:
        batch.free()
        ctx.close()


# --- verdicts kept across starts (probe_cache.py) ------------------------------------------------

def verdict_key(model_path: str, build: str, n_threads: int, n_verify: int) -> str:
    """What a verdict depends on: the model file, the build (`probe_cache.build_identity`), the
    threads and the verify length."""
    return probe_key(model_path, build, n_threads, "attention", n_verify)


def load_verdict(key: str, root: Path | None = None) -> AttnTiming | None:
    row = ProbeCache(KIND, root).load(key)
    try:
        return AttnTiming(**row) if row is not None else None
    except TypeError:  # a row of another shape: measured again
        return None


def save_verdict(key: str, timing: AttnTiming, root: Path | None = None) -> None:
    """Best effort: a read-only home only means measuring again next start."""
    ProbeCache(KIND, root).save(key, asdict(timing))
