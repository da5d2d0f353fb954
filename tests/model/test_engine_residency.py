"""Keep-alive unload and reload, warm-up and the mmap choice, on the real SmolLM2.

The keep-alive timer runs on an injected ManualClock: the test moves time and pokes the
engine thread (`tick()`); the only real-time waits are for the engine thread's answer.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from edge.clock import ManualClock
from edge.errors import EngineStopped, ModelLoadError
from edge.runtime import Engine, EngineConfig, EngineState, FinishReason, GenerationRequest, SamplingParams
from edge.runtime.llama.model import LlamaModel

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "The capital of France is"
KEEP_ALIVE_S = 30.0


def _rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


@pytest.fixture
def idle_engine(smollm2_path: Path) -> Iterator[tuple[Engine, ManualClock]]:
    clock = ManualClock()
    # idle_poll_s is huge: only tick() wakes the idle thread, so nothing depends on real time
    eng = Engine(
        EngineConfig(
            smollm2_path,
            n_ctx=2048,
            n_slots=2,
            n_threads=1,
            keep_alive_s=KEEP_ALIVE_S,
            idle_poll_s=3600,
        ),
        clock=clock,
    )
    with eng:
        yield eng, clock


def test_idle_unload_frees_memory_and_reload_gives_same_output(
    idle_engine: tuple[Engine, ManualClock],
) -> None:
    eng, clock = idle_engine
    first = eng.complete(PROMPT, max_tokens=12, temperature=0.0)
    toks = eng.tokenize("hello world")
    chat_text = eng.render_chat([{"role": "user", "content": "hi"}])

    clock.advance(KEEP_ALIVE_S - 1)
    eng.tick()
    assert not eng.wait_for_state(EngineState.UNLOADED, timeout_s=0.3)  # not idle long enough
    rss_loaded = _rss_bytes()

    clock.advance(2)
    eng.tick()
    assert eng.wait_for_state(EngineState.UNLOADED, timeout_s=30)
    rss_unloaded = _rss_bytes()
    # ~92 MiB of weights plus ~47 MiB of KV cache and compute buffers go away
    assert rss_loaded - rss_unloaded > 64 << 20, (rss_loaded >> 20, rss_unloaded >> 20)
    stats = eng.stats()
    assert stats.state is EngineState.UNLOADED and stats.kv_cells_total == 0
    # the API tokenizes and renders before queueing: both keep working without the weights
    assert eng.tokenize("hello world") == toks
    assert eng.render_chat([{"role": "user", "content": "hi"}]) == chat_text

    again = eng.complete(PROMPT, max_tokens=12, temperature=0.0)
    assert eng.state is EngineState.READY
    assert again.text == first.text and again.usage.completion_tokens == first.usage.completion_tokens
    # the KV cache went with the context, but host memory kept a copy of the idle prompt cache
    # (within engine/thread.UNLOADED_CACHE_BYTES): the resumed prompt is restored, not evaluated
    assert again.usage.cached_tokens == again.usage.prompt_tokens - 1
    assert _rss_bytes() - rss_unloaded > 64 << 20  # really loaded again


def test_explicit_unload_only_when_idle(idle_engine: tuple[Engine, ManualClock]) -> None:
    eng, _ = idle_engine
    handle = eng.submit(GenerationRequest("1, 2, 3, 4,", max_tokens=400, sampling=GREEDY))
    assert handle.get(timeout_s=30) is not None  # it is decoding now
    assert eng.unload() is False
    assert eng.state is EngineState.READY
    handle.cancel()
    events = list(handle)
    assert events[-1].finish_reason is FinishReason.CANCELLED
    assert eng.unload() is True
    assert eng.state is EngineState.UNLOADED
    assert eng.unload() is True  # already unloaded
    # a chat request (grammar-free) and a grammar request both reload and run
    res = eng.chat([{"role": "user", "content": "Say hi"}], max_tokens=4, temperature=0.0)
    assert res.usage.completion_tokens >= 1 and eng.state is EngineState.READY
    assert eng.unload() is True
    gram = eng.complete("Answer yes or no:", max_tokens=4, temperature=0.0, grammar='root ::= "yes" | "no"')
    assert gram.text in ("yes", "no")


def test_concurrent_requests_while_unloaded_all_wait_for_one_reload(
    idle_engine: tuple[Engine, ManualClock],
) -> None:
    eng, _ = idle_engine
    want = eng.complete(PROMPT, max_tokens=6, temperature=0.0).text
    assert eng.unload()
    results: list[str] = []

    def worker() -> None:
        results.append(eng.complete(PROMPT, max_tokens=6, temperature=0.0).text)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [want] * 3


def test_failed_reload_fails_requests_with_model_load_error_then_recovers(
    smollm2_path: Path, tmp_path: Path
) -> None:
    path = tmp_path / "smol.gguf"
    shutil.copyfile(smollm2_path, path)
    with Engine(EngineConfig(path, n_ctx=512, n_slots=1, n_threads=1), clock=ManualClock()) as eng:
        want = eng.complete(PROMPT, max_tokens=4, temperature=0.0).text
        assert eng.unload()
        path.rename(tmp_path / "moved.gguf")
        with pytest.raises(ModelLoadError):
            eng.complete(PROMPT, max_tokens=4, temperature=0.0)
        assert eng.state is EngineState.UNLOADED  # a later request retries
        (tmp_path / "moved.gguf").rename(path)
        assert eng.complete(PROMPT, max_tokens=4, temperature=0.0).text == want
    assert eng.state is EngineState.STOPPED
    with pytest.raises(EngineStopped):
        eng.unload()


def test_warm_up_leaves_no_trace_in_the_cache(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=1)) as eng:
        ctx = eng.residency.ctx
        assert ctx is not None
        assert [ctx.seq_pos_max(s) for s in range(2)] == [-1, -1]
        assert eng.stats().kv_cells_used == 0
        out = eng.complete(PROMPT, max_tokens=3, temperature=0.0)
        assert out.usage.prompt_tokens == len(eng.tokenize(PROMPT)) and out.usage.cached_tokens == 0


@pytest.mark.parametrize(
    ("use_mmap", "mode", "buffer"), [(True, "mmap", "CPU_Mapped model"), (False, "none", "CPU model")]
)
def test_use_mmap_reaches_llama_cpp(
    smollm2_path: Path, caplog: pytest.LogCaptureFixture, use_mmap: bool, mode: str, buffer: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="edge.llama")
    LlamaModel(smollm2_path, use_mmap=use_mmap).close()
    text = caplog.text
    assert f"load_mode = {mode}" in text
    assert f" {buffer} buffer size" in text


def test_every_decode_runs_on_the_engine_thread_warm_up_included(
        smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenMP gives each thread that runs a parallel region its own worker team: after one decode
    on the caller's thread (start() used to warm up there), the engine thread's decodes ran at
    half speed (58 vs 115 tok/s, SmolLM2, 2 threads). Warm-up and reloads belong to the engine thread."""
    import threading

    from edge.runtime.llama import model as model_mod

    seen: list[str] = []
    real = model_mod.LlamaContext.warm_up

    def spy(self: model_mod.LlamaContext, m: LlamaModel) -> None:
        seen.append(threading.current_thread().name)
        real(self, m)

    monkeypatch.setattr(model_mod.LlamaContext, "warm_up", spy)
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=1, n_threads=2)) as eng:
        assert seen == ["edge-engine"]  # start() returned after the engine thread warmed up
        assert eng.unload()
        assert eng.ensure_loaded()  # a load without a request warms up ...
        assert seen == ["edge-engine", "edge-engine"]  # ... there too
        assert eng.unload()  # (a reload for a waiting request leaves that to its own first decode)
        assert eng.complete(PROMPT, max_tokens=2, temperature=0.0).usage.completion_tokens == 2
