"""`edge eval --prompts` on the real SmolLM2: a model agrees with itself exactly, and a
requantization of it (Q4_0 made from its F16 dequantization with edge's quantizer) changes
answers, so `--min-agreement 0.99` exits 1. Kept short: three prompts, 12 tokens each, a
~280-token slice of the shipped text for the perplexity delta, one thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge.cli import main as edge_main
from edge.commands.eval import default_text, render_answers
from edge.tools.quantize import dequantize_to_f16, quantize

pytestmark = pytest.mark.model

PROMPTS = [
    {"id": "capital", "prompt": "What is the capital of France? Answer in one sentence."},
    {"id": "colours", "prompt": "List the three primary colours of light, one per line."},
    {"id": "python", "prompt": "Write a Python function that reverses a string."},
]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("eval-answers")
    prompts = d / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS), encoding="utf-8")
    text = d / "slice.txt"
    text.write_text(default_text().read_text(encoding="utf-8")[:1200], encoding="utf-8")
    return {"prompts": prompts, "text": text}


@pytest.fixture(scope="module")
def smollm2_q4_0(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("smollm2-requant")
    return quantize(dequantize_to_f16(smollm2_path, d / "f16.gguf"), d / "smollm2-q4_0.gguf", "Q4_0")


def _eval(a: Path, b: Path, files: dict[str, Path], *extra: str) -> int:
    return edge_main(["eval", str(a), "--against", str(b), "--prompts", str(files["prompts"]),
                      "--text", str(files["text"]), "--ctx", "128", "--threads", "1", "--max-tokens", "12",
                      "--json", *extra])


def test_a_model_agrees_with_itself(smollm2_path: Path, files: dict[str, Path],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert _eval(smollm2_path, smollm2_path, files, "--min-agreement", "1") == 0
    doc = json.loads(capsys.readouterr().out)
    a = doc["answers"]
    assert (a["n_prompts"], a["exact_match_rate"], a["agreement_mean"], a["agreement_worst"]) == (3, 1.0, 1.0,
                                                                                                  1.0)
    assert a["changed_most"] == [] and doc["ppl_change_pct"] == 0.0


def test_a_requantization_changes_answers_and_fails_the_floor(smollm2_path: Path, smollm2_q4_0: Path,
                                                              files: dict[str, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert _eval(smollm2_path, smollm2_q4_0, files, "--min-agreement", "0.99") == 1
    captured = capsys.readouterr()
    assert "below --min-agreement 0.99" in captured.err
    doc = json.loads(captured.out)
    a = doc["answers"]
    assert 0.0 <= a["agreement_worst"] <= a["agreement_mean"] < 1.0 and a["exact_match_rate"] < 1.0
    assert a["changed_most"] and {c["id"] for c in a["changed_most"]} <= {p["id"] for p in PROMPTS}
    assert doc["ppl_change_pct"] != 0.0  # the perplexity delta on --text comes with it
    text = "\n".join(render_answers(a))
    assert "exact match" in text and "agreement to the first differing token mean" in text
