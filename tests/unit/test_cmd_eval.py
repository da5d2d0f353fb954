"""`edge eval` without llama.cpp: arguments, exit statuses, output forms (fake loaders)."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest

from edge.cli import build_parser
from edge.commands import eval as eval_cmd
from edge.errors import InvalidRequest, ModelNotFound
from edge.tools.perplexity import PerplexityResult, plan_for_text

TEXT = " ".join(f"word{i}" for i in range(600))


class Fakes:
    """prepare/evaluate/check_vocab that record their calls; a 'token' is a word, and the
    window arithmetic is the real one, so a short text fails as it does with a model."""

    def __init__(self, ppl: dict[str, float] | None = None, vocab_error: str | None = None) -> None:
        self.ppl = ppl or {}
        self.vocab_error = vocab_error
        self.evaluated: list[dict[str, Any]] = []
        self.vocab_checked = 0

    def prepare(self, ref: str, settings: Any) -> tuple[Path, int]:
        if ref.startswith("missing"):
            raise ModelNotFound(ref)
        return Path(f"/models/{ref}"), 0

    def check_vocab(self, a: Path, b: Path, text: str) -> None:
        self.vocab_checked += 1
        if self.vocab_error:
            raise InvalidRequest(self.vocab_error, "against")

    def evaluate(self, path: Path, text: str, **kw: Any) -> PerplexityResult:
        self.evaluated.append({"path": path, **kw})
        n = len(text.split())
        windows = plan_for_text(n, kw["n_ctx"], kw["stride"], bos_prefix=False)
        kw["progress"](n - 1, n - 1)
        ppl = self.ppl.get(path.name, 10.0)
        return PerplexityResult(model=path.name, n_tokens=n, n_scored=n - 1, n_windows=len(windows),
                                n_decoded=sum(w.end - w.begin for w in windows), n_ctx=kw["n_ctx"],
                                stride=kw["stride"], mean_nll=math.log(ppl), ppl=ppl, eval_s=2.0)


def _run(argv: list[str], fakes: Fakes) -> tuple[int, str, str]:
    args = build_parser().parse_args(["eval", *argv])
    out, err = io.StringIO(), io.StringIO()
    rc = eval_cmd.run(args, out=out, err=err, prepare=fakes.prepare, evaluate=fakes.evaluate,
                      check_vocab=fakes.check_vocab)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    p = tmp_path / "text.txt"
    p.write_text(TEXT, encoding="utf-8")
    return p


def test_one_model_text_output(text_file: Path) -> None:
    fakes = Fakes({"a.gguf": 12.5})
    rc, out, err = _run(["a.gguf", "--text", str(text_file), "--ctx", "256", "--threads", "3"], fakes)
    assert rc == 0, err
    assert fakes.evaluated[0]["stride"] == 128 and fakes.evaluated[0]["n_threads"] == 3  # stride ctx/2
    assert "perplexity       12.5000" in out and "599 of 600" in out and "PPL change" not in out
    assert fakes.vocab_checked == 0


def test_against_prints_both_and_the_relative_change(text_file: Path) -> None:
    fakes = Fakes({"q8.gguf": 20.0, "q4.gguf": 23.0})
    rc, out, _ = _run(["q8.gguf", "--against", "q4.gguf", "--text", str(text_file), "--ctx", "128",
                       "--stride", "32"], fakes)
    assert rc == 0
    assert fakes.vocab_checked == 1 and [e["stride"] for e in fakes.evaluated] == [32, 32]
    ppl_line = next(line for line in out.splitlines() if line.startswith("perplexity"))
    assert ppl_line.split()[1:] == ["20.0000", "23.0000"]  # side by side
    assert "PPL change of q4.gguf vs q8.gguf: +15.00 %" in out


def test_json_is_one_object(text_file: Path) -> None:
    fakes = Fakes({"q8.gguf": 20.0, "q4.gguf": 19.0})
    rc, out, _ = _run(["q8.gguf", "--against", "q4.gguf", "--text", str(text_file), "--json"], fakes)
    assert rc == 0
    doc = json.loads(out)
    assert doc["n_ctx"] == 512 and doc["stride"] == 256
    assert doc["model"]["ppl"] == 20.0 and doc["against"]["ppl"] == 19.0
    assert doc["ppl_change_pct"] == pytest.approx(-5.0)
    assert set(doc["model"]) >= {"n_scored", "ppl", "mean_nll", "eval_s", "n_windows"}


def test_unreadable_text_is_exit_2(tmp_path: Path) -> None:
    fakes = Fakes()
    rc, _, err = _run(["a.gguf", "--text", str(tmp_path / "nope.txt")], fakes)
    assert rc == 2 and "cannot read --text" in err and "nope.txt" in err
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\x00 not utf-8")
    rc, _, err = _run(["a.gguf", "--text", str(binary)], fakes)
    assert rc == 2 and "cannot read --text" in err
    assert fakes.evaluated == []


def test_text_shorter_than_a_window_is_exit_2(tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("only a few words here", encoding="utf-8")
    rc, out, err = _run(["a.gguf", "--text", str(short), "--ctx", "64"], Fakes())
    assert rc == 2 and out == ""
    assert "the text is 5 tokens but one window needs 64 (--ctx 64)" in err


def test_bad_stride_is_exit_2(text_file: Path) -> None:
    rc, _, err = _run(["a.gguf", "--text", str(text_file), "--ctx", "64", "--stride", "64"], Fakes())
    assert rc == 2 and "--stride 64 must be between 1 and 63" in err


def test_incompatible_vocabularies_are_exit_2_before_any_decoding(text_file: Path) -> None:
    fakes = Fakes(vocab_error="vocabulary sizes differ (49152 vs 262144 tokens)")
    rc, _, err = _run(["a.gguf", "--against", "b.gguf", "--text", str(text_file)], fakes)
    assert rc == 2 and "vocabulary sizes differ" in err
    assert fakes.evaluated == []


def test_unknown_model_is_exit_2(text_file: Path) -> None:
    rc, _, err = _run(["a.gguf", "--against", "missing.gguf", "--text", str(text_file)], Fakes())
    assert rc == 2 and "model not found: missing.gguf" in err


@pytest.mark.parametrize(("argv", "needle"), [
    (["m", "--ctx", "8"], "argument --ctx: must be at least 16, got 8"),
    (["m", "--stride", "0"], "argument --stride: must be at least 1"),
    (["m", "--threads", "two"], "argument --threads: not an integer"),
])
def test_argument_errors_exit_2(argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["eval", *argv])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_shipped_text_is_there_and_long_enough() -> None:
    path = eval_cmd.default_text()
    text = path.read_text(encoding="utf-8")
    assert 5000 < len(text.split()) < 10000  # ~8.3k SmolLM2 tokens
    assert (path.parent / "README.md").read_text(encoding="utf-8").count("ublic domain") >= 3
