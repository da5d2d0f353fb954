"""Flash attention chosen by timing both kinds on this machine, once: the verdict is kept and
reused, the context runs the kind that won, and a setting or a quantized cache decides alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge.runtime import Engine, attention

pytestmark = pytest.mark.model


def _engine(path: Path, **kw: object) -> Engine:
    return Engine(path, n_ctx=1024, n_slots=2, n_threads=2, **kw)  # type: ignore[arg-type]


def test_measured_once_then_reused(smollm2_path: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    calls: list[bool] = []
    real = attention.measure

    def counting(model, n_threads, flash_attn, n_verify=0):  # type: ignore[no-untyped-def]
        calls.append(flash_attn)
        return real(model, n_threads, flash_attn, n_verify)

    monkeypatch.setattr(attention, "measure", counting)
    with _engine(smollm2_path, speculative="ngram") as eng:
        first = eng.stats()
        assert first.attention == "measured at load" and first.flash_attn in (True, False)
        text = eng.complete("The capital of France is", max_tokens=8, temperature=0.0).text
    assert sorted(calls) == [False, True]  # both kinds timed, on the engine thread, once
    doc = json.loads((tmp_path / attention.VERDICTS_FILE).read_text())
    (verdict,) = doc.values()
    assert verdict["flash_attn"] == first.flash_attn
    assert verdict["verify_s"] > verdict["step_s"] > 0  # speculating: a 9-row verify step was timed
    with _engine(smollm2_path, speculative="ngram") as eng:
        again = eng.stats()
        assert (again.attention, again.flash_attn) == ("measured on an earlier start", first.flash_attn)
        assert eng.complete("The capital of France is", max_tokens=8, temperature=0.0).text == text
    assert len(calls) == 2  # nothing timed the second time
    with _engine(smollm2_path, speculative="off") as eng:  # no verify steps: another question
        assert eng.stats().attention == "measured at load"
    assert len(calls) == 4


def test_a_setting_or_a_quantized_cache_decides_without_measuring(
        smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))

    def never(*_a: object, **_k: object) -> attention.AttnTiming:
        raise AssertionError("measured although the choice was not free")

    monkeypatch.setattr(attention, "measure", never)
    for setting, want in (("on", True), ("off", False)):
        with _engine(smollm2_path, flash_attn=setting) as eng:
            st = eng.stats()
            assert (st.flash_attn, st.attention) == (want, "setting")
            assert eng.complete("1, 2, 3,", max_tokens=4, temperature=0.0).usage.completion_tokens == 4
    with _engine(smollm2_path, kv_type="q8_0") as eng:
        st = eng.stats()
        assert (st.flash_attn, st.attention) == (True, "a quantized KV cache needs it")
    with _engine(smollm2_path, flash_attn_off_fits=False) as eng:  # the plan had no room without it
        assert eng.stats().attention == "llama.cpp auto"
    assert not (tmp_path / attention.VERDICTS_FILE).exists()
