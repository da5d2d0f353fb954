"""Engine control on the real model: cancel, overflow, prefix reuse, parking, faults, knobs."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edge.clock import ManualClock
from edge.errors import ContextOverflow, DecodeFailed, EngineStopped, InvalidRequest
from edge.runtime import (
    Engine,
    EngineConfig,
    EngineState,
    FinishReason,
    GenerationRequest,
    Knobs,
    Priority,
    SamplingParams,
)

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0)
COUNT = "1, 2, 3, 4, 5, 6, 7,"


def _req(prompt: str | list[int], n: int, **kw: object) -> GenerationRequest:
    return GenerationRequest(prompt, max_tokens=n, sampling=GREEDY, **kw)  # type: ignore[arg-type]


def _until(pred: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait for the engine thread (real time: this is a model test, not a unit test)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[Engine]:
    with Engine(EngineConfig(smollm2_path, n_ctx=1024, n_slots=4, n_threads=1)) as engine:
        yield engine


@pytest.fixture(autouse=True)
def _reset_knobs(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "smol" in request.fixturenames:
        request.getfixturevalue("smol").apply(Knobs(active_limit=4, n_threads=1))


def test_cancel_mid_stream_frees_slot_and_kv(smol: Engine) -> None:
    _until(lambda: smol.stats().active == 0)
    kv_before = smol.stats().kv_cells_used
    h = smol.submit(_req(COUNT, 200))
    events = []
    for ev in h:
        events.append(ev)
        if len(events) == 3:
            h.cancel()
        if ev.finish_reason is not None:
            break
    assert events[-1].finish_reason is FinishReason.CANCELLED
    assert events[-1].usage is not None and events[-1].usage.completion_tokens < 200
    _until(lambda: smol.stats().active == 0 and smol.stats().parked == 0)
    # its prompt and generated tokens no longer occupy KV cells (a cached slot it reused is gone too)
    assert smol.stats().kv_cells_used <= kv_before
    res = smol.complete(COUNT, temperature=0.0, max_tokens=2)
    assert res.usage.cached_tokens == 0


def test_context_overflow_raised_before_any_decode(smol: Engine) -> None:
    before = smol.stats().total_tokens_prefilled
    with pytest.raises(ContextOverflow) as err:
        smol.submit(_req([100] * smol.n_ctx, 4))
    assert err.value.n_prompt == smol.n_ctx and err.value.n_ctx == smol.n_ctx
    assert smol.stats().total_tokens_prefilled == before


@pytest.mark.parametrize(
    "bad",
    [
        _req("", 4),
        _req("hi", 0),
        GenerationRequest("hi", sampling=SamplingParams(logit_bias={10**9: 1.0})),
        GenerationRequest("hi", sampling=SamplingParams(grammar="root ::= (")),
        _req([1, 2, -5], 4),
    ],
)
def test_invalid_requests_rejected_at_submit(smol: Engine, bad: GenerationRequest) -> None:
    with pytest.raises(InvalidRequest):
        smol.submit(bad)


def test_prefix_reuse_evaluates_only_new_tokens(smol: Engine) -> None:
    system = "You are a meticulous assistant. " * 40
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "Count to three."}]
    p1 = smol.render_chat(turn1)
    r1 = smol.complete(p1, temperature=0.0, max_tokens=8, add_bos=False)
    turn2 = [*turn1, {"role": "assistant", "content": r1.text}, {"role": "user", "content": "Again."}]
    p2 = smol.render_chat(turn2)
    _until(lambda: smol.stats().active == 0)
    assert smol.stats().kv_cells_used == 0  # the cached turn is reclaimable, so not reported as used
    before = smol.stats().total_tokens_prefilled
    r2 = smol.complete(p2, temperature=0.0, max_tokens=4, add_bos=False)
    evaluated = smol.stats().total_tokens_prefilled - before
    n1 = len(smol.tokenize(p1, add_bos=False))
    assert r2.usage.cached_tokens >= n1 - 1  # the whole first prompt came from the KV cache
    assert evaluated == r2.usage.prompt_tokens - r2.usage.cached_tokens
    assert evaluated < r2.usage.prompt_tokens - n1 + r1.usage.completion_tokens + 16


def test_lower_active_limit_parks_and_resumes(smol: Engine) -> None:
    prompts = [COUNT, "a b c d e f g h"]
    reference = [h.text() for h in [smol.submit(_req(p, 16)) for p in prompts]]
    handles = [smol.submit(_req(p, 16)) for p in prompts]
    first = handles[0].get(timeout_s=30)
    assert first is not None
    smol.apply(Knobs(active_limit=1, n_threads=1))
    _until(lambda: smol.stats().parked == 1 and smol.stats().active == 1)
    progress = smol.stats().total_tokens_decoded
    _until(lambda: smol.stats().total_tokens_decoded >= progress + 3)
    assert smol.stats().parked == 1 or handles[0].done
    smol.apply(Knobs(active_limit=4, n_threads=1))
    texts = [first.text + handles[0].text(), handles[1].text()]
    assert texts == reference


def test_crashed_request_does_not_stop_others(smollm2_path: Path) -> None:
    def hook(req: GenerationRequest, tok: int) -> int:
        if req.request_id == "bad":
            raise RuntimeError("injected sampler fault")
        return tok

    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=3, n_threads=1), sample_hook=hook) as eng:
        good1 = eng.submit(_req(COUNT, 8, request_id="good1"))
        bad = eng.submit(_req(COUNT, 8, request_id="bad"))
        good2 = eng.submit(_req("a b c d e f g h", 8, request_id="good2"))
        bad_events = list(bad)
        assert bad_events[-1].finish_reason is FinishReason.ERROR
        assert isinstance(bad_events[-1].error, DecodeFailed)
        assert good1.text().startswith(" 8, 9")
        assert good2.text().startswith(" i j")
        _until(lambda: eng.stats().active == 0)
        assert eng.complete(COUNT, temperature=0.0, max_tokens=3).text.startswith(" 8")


def test_kv_full_fails_only_the_newest_sequence(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=256, n_slots=2, n_threads=1)) as eng:
        assert eng.model is not None
        ban = {t: float("-inf") for t in eng.model.eog_tokens()}
        sp = SamplingParams(temperature=0.0, logit_bias=ban)
        older = eng.submit(GenerationRequest(COUNT, max_tokens=400, sampling=sp))
        assert older.get(timeout_s=30) is not None
        newer = eng.submit(GenerationRequest("a b c d e f g h", max_tokens=400, sampling=sp))
        new_events = list(newer)
        old_events = list(older)
        assert new_events[-1].finish_reason is FinishReason.ERROR
        assert isinstance(new_events[-1].error, DecodeFailed) and new_events[-1].error.status == 1
        assert old_events[-1].finish_reason is FinishReason.LENGTH  # ran on to its context limit
        _until(lambda: eng.stats().active == 0)
        assert eng.stats().kv_cells_used <= eng.n_ctx


def test_pause_duty_and_background_admission(smollm2_path: Path) -> None:
    clock = ManualClock()
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2), clock=clock) as eng:
        eng.apply(Knobs(active_limit=2, n_threads=2, paused=True))
        h = eng.submit(_req(COUNT, 4))
        time.sleep(0.2)
        assert eng.stats().total_tokens_prefilled == 0 and not h.done
        assert eng.state is EngineState.PAUSED and eng.stats().state is EngineState.PAUSED
        eng.apply(Knobs(active_limit=2, n_threads=1, duty=0.5, admit_background=False))
        bg = eng.submit(_req("a b c d", 4, priority=Priority.BACKGROUND))
        assert h.text().startswith(" 8")
        assert not bg.done and eng.stats().waiting == 1
        assert clock.sleeps_s and all(s > 0 for s in clock.sleeps_s)  # duty < 1 idles between steps
        eng.apply(Knobs(active_limit=2, n_threads=1))
        assert bg.text().startswith(" e")
    with pytest.raises(EngineStopped):
        eng.submit(_req(COUNT, 4))


def test_off_duty_threads_alternate_instead_of_idling(smollm2_path: Path) -> None:
    """duty 0.5 with off_threads=1: steps alternate 2 and 1 threads, with no idle sleeps."""
    clock = ManualClock()
    with Engine(EngineConfig(smollm2_path, n_ctx=512, n_slots=2, n_threads=2), clock=clock) as eng:
        assert eng.complete(COUNT, temperature=0.0, max_tokens=2).text.startswith(" 8")  # context exists
        ctx = eng.residency.ctx
        assert ctx is not None
        seen: list[int] = []
        real_set = ctx.set_threads

        def spy(n: int) -> None:
            seen.append(n)
            real_set(n)

        ctx.set_threads = spy  # type: ignore[method-assign]
        with pytest.raises(InvalidRequest):
            eng.apply(Knobs(active_limit=2, n_threads=2, duty=0.5, off_threads=2))  # must be fewer
        eng.apply(Knobs(active_limit=2, n_threads=2, duty=0.5, off_threads=1))
        sleeps_before = len(clock.sleeps_s)
        out = eng.complete(COUNT, temperature=0.0, max_tokens=24)
        assert out.text.startswith(" 8") and out.usage.completion_tokens == 24
        assert seen.count(1) >= 4 and seen.count(2) >= 4  # switched back and forth (calls are changes)
        assert len(clock.sleeps_s) == sleeps_before  # stepping with fewer threads, not idling
        eng.apply(Knobs(active_limit=2, n_threads=2, duty=0.5))  # plain duty cycle idles again
        eng.complete(COUNT, temperature=0.0, max_tokens=4)
        assert len(clock.sleeps_s) > sleeps_before


def test_build_engine_validates_and_plans(smollm2_path: Path, tmp_path: Path) -> None:
    from edge.config import Settings
    from edge.errors import ConfigError, InsufficientMemory, InvalidGGUF
    from edge.host.loading import build_engine

    settings = Settings(n_ctx=512, slots=2, threads=2, models_dir=tmp_path)
    eng, plan = build_engine(smollm2_path, settings)
    assert (eng.n_ctx, eng.n_slots) == (512, 2)
    assert plan.fits and plan.n_ctx == 512 and eng.config.n_gpu_layers == plan.n_gpu_layers
    with eng:
        assert eng.complete(COUNT, temperature=0.0, max_tokens=2).text.startswith(" 8")
    with pytest.raises(InsufficientMemory):
        build_engine(smollm2_path, settings, available_bytes=lambda: 1 << 20)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(InvalidGGUF):
        build_engine(bad, settings)
    with pytest.raises(ConfigError, match="neither a built-in template"):  # before any file is read
        build_engine(bad, Settings(chat_template="chatml-tool", models_dir=tmp_path))


def test_long_prompt_is_chunked_and_does_not_freeze_streams(smollm2_path: Path) -> None:
    with Engine(EngineConfig(smollm2_path, n_ctx=1024, n_slots=2, n_threads=1, step_token_budget=64)) as eng:
        stream = eng.submit(_req(COUNT, 40))
        assert stream.get(timeout_s=30) is not None
        long_prompt = "The quick brown fox jumps over the lazy dog. " * 40  # ~400 tokens
        n_long = len(eng.tokenize(long_prompt))
        decoded_before = eng.stats().total_tokens_decoded
        late = eng.submit(_req(long_prompt, 2))
        first_late = late.get(timeout_s=60)
        assert first_late is not None
        done_during_prefill = eng.stats().total_tokens_decoded - decoded_before
        rest = list(stream)
        # the running stream kept producing while the long prompt was prefilled 64 tokens a step
        assert rest[-1].finish_reason is FinishReason.LENGTH
        assert done_during_prefill >= n_long // 64 - 1
        assert eng.perf.n_prefilled >= n_long


def test_stats_count_interactive_prompts_still_waiting_for_their_first_token(smol: Engine) -> None:
    """The scheduler parks background work only while a chat user waits for a first token."""
    _until(lambda: smol.stats().active == 0)
    long_prompt = [100] * 600  # three steps of prefill at the 256-token step budget
    bg = smol.submit(_req(long_prompt, 2, priority=Priority.BACKGROUND))
    _until(lambda: smol.stats().tokens_prefilled > 0)
    assert smol.stats().interactive_awaiting_first == 0  # background prompts do not count
    assert bg.get(timeout_s=60) is not None
    for _ in bg:
        pass
    chat = smol.submit(_req([200] * 600, 2, priority=Priority.INTERACTIVE))  # nothing cached
    _until(lambda: smol.stats().interactive_awaiting_first == 1)
    assert chat.get(timeout_s=60) is not None  # the first token came ...
    _until(lambda: smol.stats().interactive_awaiting_first == 0)  # ... and the count says so
    for _ in chat:
        pass


def test_a_prompt_alone_is_not_chunked(smollm2_path: Path) -> None:
    """The step budget bounds how long a prompt stalls running streams; with nothing decoding,
    one batch (n_batch) evaluates the prompt fastest (TTFT of a lone request)."""
    config = EngineConfig(smollm2_path, n_ctx=1024, n_slots=2, n_threads=1, step_token_budget=64, n_batch=512)
    with Engine(config) as eng:
        prompt = [100] * 300
        eng.perf.reset()
        out = eng.complete(prompt, max_tokens=1, temperature=0.0)
        # the answer is out before the engine thread books its step: wait for the booking
        deadline = time.monotonic() + 10.0
        while eng.perf.steps == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.usage.prompt_tokens == 300 and eng.perf.n_prefilled == 300
        assert eng.perf.steps == 1  # one step: 300 tokens in one batch, not five chunks of 64
