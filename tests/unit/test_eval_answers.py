"""`edge eval --prompts`: the answer comparison (pure), the prompt files, and the command's output
and exit statuses with fake answers (no llama.cpp)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from edge.cli import build_parser
from edge.commands import eval as eval_cmd
from edge.errors import InvalidRequest
from edge.tools.answers import Answer, Prompt, agreement, compare, first_difference, load_prompts
from tests.unit.test_cmd_eval import TEXT, Fakes


def test_agreement_is_the_share_before_the_first_difference() -> None:
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0 and first_difference([1, 2], [1, 2]) is None
    assert agreement([1, 2, 9, 4], [1, 2, 3, 4]) == 0.5 and first_difference([1, 2, 9], [1, 2, 3]) == 2
    assert agreement([1, 2], [1, 2, 3, 4]) == 0.5  # one stopped early: agrees only that far
    assert agreement([5], [6]) == 0.0 and agreement([], []) == 1.0 and agreement([], [1]) == 0.0


def _p(i: str) -> Prompt:
    return Prompt(i, [{"role": "user", "content": i}], 8)


def test_compare_reports_rates_and_the_prompts_that_changed_most() -> None:
    a = [Answer((1, 2, 3, 4), "w x y z"), Answer((1, 2), "w x"), Answer((7, 8, 9, 10), "p q r s")]
    b = [Answer((1, 2, 3, 4), "w x y z"), Answer((1, 3), "w v"), Answer((5, 8, 9, 10), "t q r s")]
    c = compare([_p("same"), _p("half"), _p("first")], a, b)
    assert c["n_prompts"] == 3 and c["exact_match_rate"] == pytest.approx(1 / 3)
    assert c["agreement_mean"] == pytest.approx(0.5) and c["agreement_worst"] == 0.0
    assert [x["id"] for x in c["changed_most"]] == ["first", "half"]  # worst first, equal ones left out
    assert c["changed_most"][0] == {"id": "first", "agreement": 0.0, "first_difference": 0,
                                    "a": "p q r s", "b": "t q r s"}
    assert c["per_prompt"] == {"same": 1.0, "half": 0.5, "first": 0.0}


def test_prompt_files(tmp_path: Path) -> None:
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "prompt": "hi"}\n\n{"messages": [{"role": "user", "content": "yo"}], '
                 '"max_tokens": 5}\n')
    a, b = load_prompts(f, max_tokens=9)
    assert (a.id, a.messages, a.max_tokens) == ("a", [{"role": "user", "content": "hi"}], 9)
    assert (b.id, b.max_tokens) == ("3", 5)  # id: the line number when none is given
    for bad in ('{"id": "x"}', "not json", '{"prompt": "x", "max_tokens": 0}', '{"messages": []}', "[1]"):
        f.write_text('{"prompt": "ok"}\n' + bad + "\n")
        with pytest.raises(InvalidRequest, match="line 2"):
            load_prompts(f)
    f.write_text("\n")
    with pytest.raises(InvalidRequest, match="no prompts"):
        load_prompts(f)


def test_the_shipped_prompt_set() -> None:
    prompts = load_prompts(eval_cmd.default_prompts())
    assert len(prompts) == 16 and len({p.id for p in prompts}) == 16
    assert any(p.messages[0]["role"] == "system" for p in prompts)


class FakeAnswers:
    """Answers per model file name: token tuples (text: the tokens joined)."""

    def __init__(self, by_model: dict[str, list[tuple[int, ...]]]) -> None:
        self.by_model = by_model
        self.calls: list[dict[str, Any]] = []

    def __call__(self, path: Path, prompts: list[Prompt], **kw: Any) -> list[Answer]:
        self.calls.append({"path": path, "n": len(prompts), **kw})
        kw["progress"](len(prompts), len(prompts))
        return [Answer(t, " ".join(map(str, t))) for t in self.by_model[path.name]]


def _run(argv: list[str], answers: FakeAnswers, tmp_path: Path) -> tuple[int, str, str]:
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "one", "prompt": "a"}\n{"id": "two", "prompt": "b"}\n')
    argv = [a.replace("PROMPTS", str(prompts)) for a in argv]
    args = build_parser().parse_args(["eval", *argv, "--text", str(text), "--ctx", "128"])
    out, err = io.StringIO(), io.StringIO()
    fakes = Fakes()
    rc = eval_cmd.run(args, out=out, err=err, prepare=fakes.prepare, evaluate=fakes.evaluate,
                      check_vocab=fakes.check_vocab, answer=answers)
    return rc, out.getvalue(), err.getvalue()


def test_the_same_answers_pass_any_floor(tmp_path: Path) -> None:
    same = FakeAnswers({"a.gguf": [(1, 2), (3,)], "b.gguf": [(1, 2), (3,)]})
    rc, out, err = _run(["a.gguf", "--against", "b.gguf", "--prompts", "PROMPTS", "--min-agreement", "1"],
                        same, tmp_path)
    assert rc == 0, err
    assert "exact match 100.0%" in out and "mean 1.000, worst 1.000" in out and "changed most" not in out
    assert [c["path"].name for c in same.calls] == ["a.gguf", "b.gguf"]


def test_changed_answers_below_the_floor_exit_1_and_name_the_prompt(tmp_path: Path) -> None:
    diff = FakeAnswers({"a.gguf": [(1, 2, 3, 4), (3,)], "b.gguf": [(1, 9, 9, 9), (3,)]})
    rc, out, err = _run(["a.gguf", "--against", "b.gguf", "--prompts", "PROMPTS", "--min-agreement",
                         "0.99", "--json"], diff, tmp_path)
    assert rc == 1 and "below --min-agreement 0.99" in err
    doc = json.loads(out)
    ans = doc["answers"]
    assert (ans["exact_match_rate"], ans["agreement_mean"], ans["agreement_worst"]) == (0.5, 0.625, 0.25)
    assert ans["changed_most"][0]["id"] == "one" and ans["changed_most"][0]["first_difference"] == 1
    assert doc["ppl_change_pct"] is not None  # the perplexity delta on --text is still there
    rc, out, _ = _run(["a.gguf", "--against", "b.gguf", "--prompts", "PROMPTS"], diff, tmp_path)
    assert rc == 0 and "one                      0.250 at token 1" in out  # no floor: reported only


def test_prompts_need_two_models_and_the_floor_needs_prompts(tmp_path: Path) -> None:
    none = FakeAnswers({})
    rc, _, err = _run(["a.gguf", "--prompts", "PROMPTS"], none, tmp_path)
    assert rc == 2 and "--against" in err
    rc, _, err = _run(["a.gguf", "--against", "b.gguf", "--min-agreement", "0.5"], none, tmp_path)
    assert rc == 2 and "--min-agreement needs --prompts" in err
    assert none.calls == []
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "a.gguf", "--min-agreement", "1.5"])


def test_prompts_without_a_file_is_the_shipped_set() -> None:
    args = build_parser().parse_args(["eval", "a.gguf", "--against", "b.gguf", "--prompts"])
    assert args.prompts == eval_cmd.default_prompts() and args.prompts.is_file()
