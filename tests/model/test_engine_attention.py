"""Flash attention: llama.cpp's choice by default, where greedy answers do not depend on batching;
with `fastest` chosen by timing both kinds on this machine, once: the verdict is kept and reused,
the context runs the kind that won, and a setting or a quantized cache decides alone."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from edge.runtime import Engine, EngineConfig
from edge.runtime.llama import attention

pytestmark = pytest.mark.model


def _engine(path: Path, **kw: object) -> Engine:
    return Engine(EngineConfig(path, n_ctx=1024, n_slots=2, n_threads=2, **kw))  # type: ignore[arg-type]


def test_measured_once_after_ready_then_reused(smollm2_path: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    calls: list[tuple[bool, str]] = []
    real, go = attention.probe, threading.Event()

    def counting(model, n_threads, flash_attn, n_verify=0):  # type: ignore[no-untyped-def]
        assert go.wait(120.0)
        calls.append((flash_attn, threading.current_thread().name))
        return (yield from real(model, n_threads, flash_attn, n_verify))

    monkeypatch.setattr(attention, "probe", counting)
    with _engine(smollm2_path, speculative="ngram", flash_attn="fastest") as eng:
        assert (eng.stats().attention, eng.stats().flash_attn) == ("on until measured", True)
        assert not calls  # ready, and nothing timed yet
        go.set()
        assert eng.wait_for_probes(120.0)  # timed in idle turns after ready
        first = eng.stats()
        assert first.attention == "measured after start" and first.flash_attn in (True, False)
        text = eng.complete("The capital of France is", max_tokens=8, temperature=0.0).text
    assert sorted(calls) == [(False, "edge-engine"), (True, "edge-engine")]  # both kinds, once, there
    doc = json.loads((tmp_path / attention.VERDICTS_FILE).read_text())
    (verdict,) = doc.values()
    assert verdict["flash_attn"] == first.flash_attn
    assert verdict["verify_s"] > verdict["step_s"] > 0  # speculating: a 9-row verify step was timed
    with _engine(smollm2_path, speculative="ngram", flash_attn="fastest") as eng:
        again = eng.stats()  # opened with the verdict: nothing owed
        assert (again.attention, again.flash_attn) == ("measured on an earlier start", first.flash_attn)
        assert eng.complete("The capital of France is", max_tokens=8, temperature=0.0).text == text
    assert len(calls) == 2  # nothing timed the second time
    # no verify steps: another question
    with _engine(smollm2_path, speculative="off", flash_attn="fastest") as eng:
        assert eng.wait_for_probes(120.0) and eng.stats().attention == "measured after start"
    assert len(calls) == 4


def test_a_setting_or_a_quantized_cache_decides_without_measuring(
        smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))

    measured: list[object] = []

    def never(*a: object, **_k: object) -> attention.AttnTiming:
        measured.append(a)  # (a raise alone would only be logged: the probe is an idle-time task)
        raise AssertionError("measured although the choice was not free")

    monkeypatch.setattr(attention, "probe", never)
    for setting, want in (("on", True), ("off", False)):
        with _engine(smollm2_path, flash_attn=setting) as eng:
            st = eng.stats()
            assert (st.flash_attn, st.attention) == (want, "setting")
            assert eng.complete("1, 2, 3,", max_tokens=4, temperature=0.0).usage.completion_tokens == 4
    with _engine(smollm2_path, kv_type="q8_0") as eng:
        st = eng.stats()
        assert (st.flash_attn, st.attention) == (True, "a quantized KV cache needs it")
    with _engine(smollm2_path, flash_attn="fastest", flash_attn_off_fits=False) as eng:  # no room without it
        assert eng.stats().attention == "llama.cpp auto"
    with _engine(smollm2_path) as eng:  # the default
        assert (eng.stats().attention, eng.stats().flash_attn) == ("llama.cpp auto", None)
        assert eng.wait_for_probes(120.0)
    assert not measured and not (tmp_path / attention.VERDICTS_FILE).exists()


ASK = [{"role": "user", "content": "Name a colour."}]


def test_by_default_the_same_greedy_request_answers_the_same_every_time(smollm2_path: Path) -> None:
    """The second and third asks find the prompt cached and evaluate its last token alone, and
    speculation batches drafts: neither may change a greedy answer. (Without flash attention
    this CPU backend sums K·Q in another order for one row than for several, and SmolLM2 then
    answered "The colour I'm referring to ..." the first time and "The colour is ..." after.)"""
    with _engine(smollm2_path, speculative="ngram") as eng:
        answers = [eng.chat(ASK, max_tokens=24, temperature=0.0) for _ in range(3)]
    assert answers[1].usage.cached_tokens > 0  # the cache was hit
    assert len({a.text for a in answers}) == 1, [a.text for a in answers]
