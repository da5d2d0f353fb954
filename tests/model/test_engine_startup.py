"""Fast loads on the real SmolLM2: ready before any probe, probe answers kept and reused, and a
reload after an unload that reuses what the unload kept.

The only real-time waits are for the engine thread's answers (events with timeouts).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from edge.runtime import Engine, EngineConfig, EngineState, GenerationRequest, SamplingParams
from edge.runtime.llama import model as model_mod
from edge.runtime.llama import pages
from edge.runtime.llama.model import ContextConfig, LlamaModel
from edge.runtime.spec import calibration

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"
WAIT_S = 120.0


def _engine(path: Path, n_threads: int = 2) -> Engine:
    return Engine(EngineConfig(path, n_ctx=1024, n_slots=2, n_threads=n_threads, speculative="ngram",
                               draft_max=4))


class GatedProbe:
    """The real curve probe, held at its first slice until `release` is set; counts its decodes."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.decodes = 0
        self.threads: set[str] = set()
        self.real = calibration.measure_steps

    def __call__(self, model: LlamaModel, cfg: ContextConfig, n_max: int,
                 out: dict[int, float]) -> Iterator[None]:
        for _ in self.real(model, cfg, n_max, out):
            assert self.release.wait(WAIT_S)
            self.threads.add(threading.current_thread().name)
            self.decodes += 1
            yield


def test_ready_before_the_calibration_then_its_curve_is_reused_per_threads(
        smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    probe = GatedProbe()
    monkeypatch.setattr(calibration, "measure_steps", probe)
    kept = tmp_path / f"{calibration.KIND}.json"
    with _engine(smollm2_path) as eng:
        assert eng.state is EngineState.READY and probe.decodes == 0  # ready while the probe waits
        assert not kept.exists() and not eng.wait_for_probes(0.0)
        probe.release.set()
        assert eng.wait_for_probes(WAIT_S)
        assert probe.threads == {"edge-engine"} and probe.decodes > 0
        assert eng.complete(PROMPT, max_tokens=4, temperature=0.0).usage.completion_tokens == 4
    (curve,) = json.loads(kept.read_text()).values()
    assert sorted(int(n) for n in curve["by_n"]) == [1, 2, 3, 4, 5]  # draft_max 4: steps of 1..5 tokens
    decodes = probe.decodes
    with _engine(smollm2_path) as eng:  # same model, build and threads: read, not measured
        assert eng.wait_for_probes(WAIT_S) and probe.decodes == decodes
    with _engine(smollm2_path, n_threads=1) as eng:  # another thread count: another curve
        assert eng.wait_for_probes(WAIT_S) and probe.decodes > decodes
    assert len(json.loads(kept.read_text())) == 2


def _rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


@pytest.mark.parametrize("keep_model", [True, False], ids=["weights-to-page-cache", "vocabulary-only"])
def test_a_reload_reuses_what_the_unload_kept(smollm2_path: Path, tmp_path: Path, keep_model: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Where every weight is computed from the file mapping (CPU, no repacked copies, Linux) an
    unload gives the weights' pages back and keeps the model: the reload parses nothing again.
    Elsewhere it keeps a vocabulary-only model, made in idle time after ready and made once."""
    if keep_model and not pages.supported():
        pytest.skip("no /proc/self/maps: the weights' pages cannot be given back here")
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(model_mod, "extra_buffers", lambda: False)  # no repacked copies: all mapped
    monkeypatch.setattr(pages, "supported", lambda maps=pages.MAPS: keep_model)
    warmed: list[str] = []
    real_warm = model_mod.LlamaContext.warm_up

    def spy(self: model_mod.LlamaContext, m: LlamaModel) -> None:
        warmed.append(threading.current_thread().name)
        real_warm(self, m)

    monkeypatch.setattr(model_mod.LlamaContext, "warm_up", spy)
    loads: list[tuple[bool, str]] = []  # (vocab_only, thread)
    real_init = model_mod.LlamaModel.__init__

    def counting(self: LlamaModel, *a: object, **kw: object) -> None:
        loads.append((bool(kw.get("vocab_only")), threading.current_thread().name))
        real_init(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(model_mod.LlamaModel, "__init__", counting)
    with _engine(smollm2_path) as eng:
        assert eng.wait_for_probes(WAIT_S)
        full = eng.model
        assert full is not None and full.weight_buffers == ("CPU_Mapped",)  # llama.cpp's own account
        made_ahead = [] if keep_model else [(True, "edge-engine")]  # what an unload keeps: unloads are quick
        assert loads == [(False, "MainThread"), *made_ahead]
        want = eng.complete(PROMPT, max_tokens=6, temperature=0.0).text
        template = eng.residency.template
        assert warmed == ["edge-engine"]
        rss_loaded = _rss_bytes()
        assert eng.unload()
        kept = eng.model
        assert kept is not None and (kept is full) is keep_model and kept.vocab_only is not keep_model
        assert rss_loaded - _rss_bytes() > 64 << 20  # ~92 MiB of weights and the KV cache went either way
        # a request reloads: no warm-up of its own, its first decode does that job
        assert eng.complete(PROMPT, max_tokens=6, temperature=0.0).text == want
        assert warmed == ["edge-engine"]
        assert (eng.model is full) is keep_model
        assert eng.residency.template is template  # parsed once, kept through the unload
        assert eng.wait_for_probes(0.0)  # nothing measured again
        assert eng.unload() and eng.model is kept  # made once, kept
        # a load without a request (Ollama's empty prompt) warms up, on the engine thread
        assert eng.ensure_loaded() and warmed == ["edge-engine", "edge-engine"]
        h = eng.submit(GenerationRequest(PROMPT, max_tokens=6, sampling=SamplingParams(temperature=0.0)))
        assert "".join(e.text for e in h) == want
    reloads = [t for vocab_only, t in loads[1 + len(made_ahead):] if not vocab_only]
    assert reloads == ([] if keep_model else ["edge-engine", "edge-engine"])  # the weights: parsed again?


def test_an_unload_keeps_a_few_prompt_caches_in_host_memory(smollm2_path: Path) -> None:
    """A conversation that goes on after a keep-alive unload is restored, not evaluated again;
    an engine without host memory for caches keeps none."""
    chat = [{"role": "user", "content": "Name three colours."}]
    for cache_bytes, restored in ((8 << 20, True), (0, False)):
        cfg = EngineConfig(smollm2_path, n_ctx=1024, n_slots=2, n_threads=2, prompt_cache_bytes=cache_bytes)
        with Engine(cfg) as eng:
            first = eng.chat(chat, max_tokens=4, temperature=0.0)
            assert eng.unload()
            st = eng.stats()
            assert (st.prompt_cache_entries > 0) is restored and st.kv_cells_total == 0
            again = eng.chat(chat, max_tokens=4, temperature=0.0)
            assert again.text == first.text
            want = again.usage.prompt_tokens - 1 if restored else 0
            assert again.usage.cached_tokens == want



def test_a_kept_model_whose_file_was_replaced_is_loaded_anew(smollm2_path: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if not pages.supported():
        pytest.skip("no /proc/self/maps: the weights' pages cannot be given back here")
    monkeypatch.setattr(model_mod, "extra_buffers", lambda: False)
    path = tmp_path / "smol.gguf"
    shutil.copyfile(smollm2_path, path)
    with Engine(EngineConfig(path, n_ctx=512, n_slots=1, n_threads=2)) as eng:
        want = eng.complete(PROMPT, max_tokens=4, temperature=0.0).text
        assert eng.unload()
        kept = eng.model
        assert kept is not None and not kept.vocab_only  # the model stayed, its pages went back
        assert eng.complete(PROMPT, max_tokens=4, temperature=0.0).text == want and eng.model is kept
        assert eng.unload()
        fresh = tmp_path / "fresh.gguf"
        shutil.copyfile(smollm2_path, fresh)
        os.replace(fresh, path)  # `edge pull` put a new file in its place
        assert eng.complete(PROMPT, max_tokens=4, temperature=0.0).text == want
        assert eng.model is not kept and kept._closed  # the new file loaded, the old model freed
