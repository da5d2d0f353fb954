"""Distribution specs (good and bad) and deterministic prompts for a seed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from edge.bench.workload import WORDS, Dist, Workload, load_jsonl, make_prompt, parse_dist
from edge.errors import ConfigError


def test_good_specs(tmp_path: Path) -> None:
    assert parse_dist("fixed:128", "p") == Dist("fixed", 128, 128, spec="fixed:128")
    assert parse_dist("uniform:32-256", "p") == Dist("uniform", 32, 256, spec="uniform:32-256")
    assert parse_dist(" Uniform: 5 - 5 ", "p").hi == 5
    f = tmp_path / "reqs.jsonl"
    f.write_text('{"prompt": "hi"}\n')
    d = parse_dist(f"jsonl:{f}", "prompt-lengths", allow_jsonl=True)
    assert d.kind == "jsonl" and d.path == f


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("fixed", "not a distribution"),
        ("fixed:", "not a distribution"),
        ("fixed:abc", "'abc' is not an integer"),
        ("fixed:0", "out of range"),
        ("uniform:10", "expected uniform:A-B"),
        ("uniform:30-10", "lower bound 30 is above the upper bound 10"),
        ("uniform:1-x", "'x' is not an integer"),
        ("gauss:3", "unknown kind 'gauss'"),
        ("jsonl:foo.jsonl", "unknown kind 'jsonl'"),  # not allowed for max_tokens
    ],
)
def test_bad_specs_name_the_problem(spec: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_dist(spec, "max-tokens")
    assert err.value.field == "max-tokens"
    assert needle in str(err.value)


def test_bad_jsonl(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        parse_dist(f"jsonl:{tmp_path / 'missing.jsonl'}", "prompt-lengths", allow_jsonl=True)
    f = tmp_path / "bad.jsonl"
    f.write_text('{"prompt": "ok"}\n\n{"nothing": 1}\n')
    with pytest.raises(ConfigError, match="line 3: needs"):
        load_jsonl(f)
    f.write_text('{"prompt": "ok"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2: not JSON"):
        load_jsonl(f)
    f.write_text("\n")
    with pytest.raises(ConfigError, match="no requests"):
        load_jsonl(f)


def test_prompts_are_deterministic_for_a_seed() -> None:
    def mk(seed: int) -> Workload:
        return Workload(parse_dist("uniform:10-40", "p"), parse_dist("uniform:5-9", "m"), seed=seed)

    a, b, c = mk(7), mk(7), mk(8)
    assert [a.request(2, i) for i in range(5)] == [b.request(2, i) for i in range(5)]
    assert a.request(2, 0) != c.request(2, 0)
    assert a.request(2, 0) != a.request(4, 0)  # the next step does not resend the same prompts
    for i in range(20):
        req = a.request(1, i)
        assert 10 <= len(req.body["messages"][0]["content"].split()) <= 40
        assert 5 <= req.max_tokens <= 9 and req.body["max_tokens"] == req.max_tokens
        assert req.body["temperature"] == 0


def test_make_prompt_uses_the_word_list() -> None:
    text = make_prompt(50, random.Random(1))
    assert len(text.split()) == 50 and set(text.split()) <= set(WORDS)
    assert make_prompt(50, random.Random(1)) == text


def test_completions_endpoint_and_jsonl_records(tmp_path: Path) -> None:
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in (
        {"messages": [{"role": "user", "content": "from a chat"}]}, {"prompt": "a plain prompt"})))
    dist = parse_dist(f"jsonl:{f}", "prompt-lengths", allow_jsonl=True)
    chat = Workload(dist, parse_dist("fixed:4", "m"), seed=1)
    comp = Workload(dist, parse_dist("fixed:4", "m"), seed=1, endpoint="completions")
    assert chat.path == "/v1/chat/completions" and comp.path == "/v1/completions"
    seen_chat = {chat.request(1, i).body["messages"][0]["content"] for i in range(30)}
    seen_comp = {comp.request(1, i).body["prompt"] for i in range(30)}
    assert seen_chat == {"from a chat", "a plain prompt"} == seen_comp
    assert chat.request(1, 3).prompt_words is None


def test_ignore_eos_bans_the_models_end_tokens_in_every_request(tmp_path) -> None:
    from edge.bench.workload import Workload, end_tokens, parse_dist
    from tests.ggufgen import write_tiny_model

    path = write_tiny_model(tmp_path / "tiny.gguf")  # eos 2, no eot
    assert end_tokens(path) == (2,)
    w = Workload(parse_dist("fixed:8", "p"), parse_dist("fixed:4", "m"), ban_tokens=(2, 7))
    assert w.request(1, 0).body["logit_bias"] == {"2": -100, "7": -100}
    plain = Workload(parse_dist("fixed:8", "p"), parse_dist("fixed:4", "m"))
    assert "logit_bias" not in plain.request(1, 0).body
