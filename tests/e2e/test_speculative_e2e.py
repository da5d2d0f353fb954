"""`edge serve --speculative draft --draft-model ...` over loopback with the real OpenAI client:
the answer is the plain greedy one, the draft model's guesses show in /v1/status and /metrics,
and a draft model with another vocabulary stops the server at load with both named."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import LiveServer, launch

pytestmark = [pytest.mark.e2e, pytest.mark.model]
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
ASK = [{"role": "user", "content": f"Repeat this code exactly:\n{CODE}"}]


@pytest.fixture(scope="module")
def servers(smollm2_path: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    common = ("--slots", "1", "--ctx", "256", "--threads", "2", "--no-scheduler")
    plain = launch(tmp_path_factory.mktemp("plain"), smollm2_path, *common, "--speculative", "off")
    drafted = launch(tmp_path_factory.mktemp("draft"), smollm2_path, *common, "--speculative", "draft",
                     "--draft-model", str(smollm2_path))
    yield plain, drafted
    assert plain.stop() == 0 and drafted.stop() == 0


def test_draft_model_serves_the_plain_greedy_answer(servers: tuple[LiveServer, LiveServer]) -> None:
    plain, drafted = servers
    answers = []
    for s in (plain, drafted):
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="none")
        # forced: SmolLM2 drafting for itself guesses right but costs a whole step per guess, so
        # left to itself the engine soon stops drafting (what the adaptive rule is for)
        r = client.chat.completions.create(model=client.models.list().data[0].id, messages=ASK,  # type: ignore[arg-type]
                                           max_tokens=48, temperature=0,
                                           extra_body={"speculative": True} if s is drafted else None)
        answers.append(r.choices[0].message.content)
    assert answers[0] and answers[1] == answers[0]
    engine = httpx.get(drafted.url + "/v1/status").json()["engine"]
    assert engine["speculative"] == "draft" and engine["spec_accepted"] > 10
    metrics = httpx.get(drafted.url + "/metrics").text
    drafted_total = next(float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith("edge_spec_drafted_tokens_total"))
    assert drafted_total >= engine["spec_accepted"]


def test_a_draft_model_of_another_vocabulary_stops_the_server(smollm2_path: Path, gemma_path: Path,
                                                               tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "edge.cli", "serve", str(smollm2_path), "--port", "0",
                        "--speculative", "draft", "--draft-model", str(gemma_path)],
                       capture_output=True, text=True, timeout=120, env={"EDGE_MODELS_DIR": str(tmp_path),
                                                                         "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2, r.stderr
    assert "SPM vocabulary of 262144 tokens" in r.stderr and "BPE vocabulary of 49152 tokens" in r.stderr
