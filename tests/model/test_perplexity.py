"""Perplexity with the real engine: sane and repeatable on SmolLM2, and quantizations rank as
their precision says (F16 -> Q8_0 -> Q4_0 made here from one common F16 source).

Kept short: windows of 256 tokens every 128 over the first ~560 tokens of the shipped text,
one thread (the figures do not depend on the thread count; the machine is shared).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from edge.cli import main as edge_main
from edge.commands.eval import default_text
from edge.errors import InvalidRequest, ModelLoadError
from edge.tools import perplexity as ppl_mod
from edge.tools.perplexity import PerplexityResult, check_same_vocab, evaluate, plan_windows
from edge.tools.quantize import dequantize_to_f16, quantize

pytestmark = pytest.mark.model

CTX, STRIDE, THREADS = 256, 128, 1
SLICE_CHARS = 2400  # ~560 SmolLM2 tokens: 4 windows


@pytest.fixture(scope="session")
def eval_text() -> str:
    return default_text().read_text(encoding="utf-8")[:SLICE_CHARS]


@pytest.fixture(scope="session")
def eval_text_file(eval_text: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("eval-text") / "slice.txt"
    path.write_text(eval_text, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def smollm2_quants(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One common higher-precision source and two quantizations of it: the shipped Q4_1 file
    dequantized to F16 (gguf-py), then quantized by llama.cpp to Q8_0 and Q4_0."""
    d = tmp_path_factory.mktemp("smollm2-quants")
    f16 = dequantize_to_f16(smollm2_path, d / "smollm2-f16.gguf")
    return {
        "F16": f16,
        "Q8_0": quantize(f16, d / "smollm2-q8_0.gguf", "Q8_0"),
        "Q4_0": quantize(f16, d / "smollm2-q4_0.gguf", "Q4_0"),
    }


@pytest.fixture(scope="session")
def run_ppl(eval_text: str) -> Callable[[Path], PerplexityResult]:
    """A fresh evaluation of the slice on every call."""
    def run(path: Path) -> PerplexityResult:
        return evaluate(path, eval_text, n_ctx=CTX, stride=STRIDE, n_threads=THREADS)

    return run


@pytest.fixture(scope="session")
def ppl_of(run_ppl: Callable[[Path], PerplexityResult]) -> Callable[[Path], PerplexityResult]:
    """run_ppl, once per file for the session (the tests share figures, not runs they compare)."""
    cache: dict[Path, PerplexityResult] = {}

    def get(path: Path) -> PerplexityResult:
        if path not in cache:
            cache[path] = run_ppl(path)
        return cache[path]

    return get


def test_smollm2_perplexity_is_sane_and_repeatable(smollm2_path: Path,
                                                   run_ppl: Callable[[Path], PerplexityResult],
                                                   ppl_of: Callable[[Path], PerplexityResult]) -> None:
    first, second = ppl_of(smollm2_path), run_ppl(smollm2_path)
    print(f"SmolLM2 Q4_1: ppl {first.ppl:.4f} over {first.n_scored} tokens in {first.eval_s:.1f} s")
    assert math.isfinite(first.ppl) and 2.0 < first.ppl < 200.0
    assert first.mean_nll == pytest.approx(math.log(first.ppl))
    assert abs(second.ppl - first.ppl) / first.ppl < 1e-6
    assert first.n_scored == first.n_tokens - 1  # SmolLM2 adds no BOS: all but the first token
    assert first.n_windows == len(plan_windows(first.n_tokens, CTX, STRIDE)) == 4


def test_smaller_logits_chunks_give_the_same_figure(smollm2_quants: dict[str, Path],
                                                    run_ppl: Callable[[Path], PerplexityResult],
                                                    ppl_of: Callable[[Path], PerplexityResult],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows read back after each llama_decode line up with their targets whatever the chunking:
    16 logits rows per decode (many chunks) scores as one big chunk does. F16 weights: with
    quantized ones llama.cpp's small-batch kernels round differently (Q4_1: 0.16 % in PPL).
    Even in F16 the CPU attention sums in another order for another batch shape: 6.5e-5 on
    this 2-core EPYC VM. A row read against the wrong target moves PPL by whole percents."""
    f16 = smollm2_quants["F16"]
    base = ppl_of(f16)
    monkeypatch.setattr(ppl_mod, "logits_rows", lambda n_vocab: 16)
    chunked = run_ppl(f16)
    assert chunked.n_scored == base.n_scored
    assert abs(chunked.ppl - base.ppl) / base.ppl < 2e-4


def test_quantizations_rank_by_precision(smollm2_path: Path, smollm2_quants: dict[str, Path],
                                         ppl_of: Callable[[Path], PerplexityResult]) -> None:
    ppl = {name: ppl_of(path).ppl for name, path in smollm2_quants.items()}
    ppl["Q4_1 (original)"] = ppl_of(smollm2_path).ppl
    print("  ".join(f"{k} {v:.4f}" for k, v in ppl.items()))
    # the F16 file is the Q4_1 weights written exactly in F16: the same model up to rounding
    assert abs(ppl["F16"] - ppl["Q4_1 (original)"]) / ppl["Q4_1 (original)"] < 0.01
    assert abs(ppl["Q8_0"] - ppl["F16"]) / ppl["F16"] < 0.02
    assert ppl["Q4_0"] > ppl["Q8_0"] * 1.02  # clearly worse, not noise


def test_cli_against_prints_the_relative_change(smollm2_quants: dict[str, Path], eval_text_file: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc = edge_main(["eval", str(smollm2_quants["Q8_0"]), "--against", str(smollm2_quants["Q4_0"]),
                    "--text", str(eval_text_file), "--ctx", str(CTX), "--threads", str(THREADS)])
    out = capsys.readouterr().out
    assert rc == 0, out
    print(out)
    ppl_line = next(line for line in out.splitlines() if line.startswith("perplexity"))
    p8, p4 = (float(x) for x in ppl_line.split()[1:])
    m = re.search(r"PPL change of smollm2-q4_0\.gguf vs smollm2-q8_0\.gguf: ([+-]\d+\.\d+) %", out)
    assert m is not None, out
    assert float(m.group(1)) == pytest.approx((p4 - p8) / p8 * 100, abs=0.01)
    assert float(m.group(1)) > 2.0


def test_cli_text_shorter_than_a_window_is_exit_2(smollm2_path: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    short = tmp_path / "short.txt"
    short.write_text("Alice was beginning to get very tired of sitting by her sister.", encoding="utf-8")
    rc = edge_main(["eval", str(smollm2_path), "--text", str(short), "--ctx", "64"])
    err = capsys.readouterr().err
    assert rc == 2
    assert re.search(r"the text is \d+ tokens but one window needs 64 \(--ctx 64\)", err), err


def test_different_tokenizers_are_refused(smollm2_path: Path, gemma_path: Path, eval_text: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InvalidRequest, match="vocabulary sizes differ") as err:
        check_same_vocab(smollm2_path, gemma_path, eval_text)
    assert err.value.param == "against"
    rc = edge_main(["eval", str(smollm2_path), "--against", str(gemma_path), "--ctx", "64"])
    assert rc == 2 and "incompatible vocabularies" in capsys.readouterr().err


def test_f16_copy_keeps_the_metadata(smollm2_path: Path, smollm2_quants: dict[str, Path]) -> None:
    import gguf

    src, dst = gguf.GGUFReader(smollm2_path), gguf.GGUFReader(smollm2_quants["F16"])
    skip = {"general.file_type", "GGUF.kv_count"}
    assert {k for k in src.fields if k not in skip} == {k for k in dst.fields if k not in skip}
    for key in ("general.name", "tokenizer.chat_template", "llama.context_length",
                "tokenizer.ggml.eos_token_id"):
        assert src.fields[key].contents() == dst.fields[key].contents()
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        assert len(src.fields[key].data) == len(dst.fields[key].data) > 1000
    assert dst.fields["general.file_type"].contents() == 1  # LLAMA_FTYPE_MOSTLY_F16
    types = {t.name: t.tensor_type.name for t in dst.tensors}
    assert set(types.values()) == {"F16", "F32"}
    assert [(t.name, list(t.shape)) for t in src.tensors] == [(t.name, list(t.shape)) for t in dst.tensors]


def test_requantizing_needs_consent(smollm2_path: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="already quantized: allow requantizing"):
        quantize(smollm2_path, tmp_path / "x.gguf", "Q8_0")
    assert list(tmp_path.iterdir()) == []  # no partial file left behind
    with pytest.raises(InvalidRequest, match="unknown quantization type 'Q9_9'"):
        quantize(smollm2_path, tmp_path / "x.gguf", "Q9_9")
