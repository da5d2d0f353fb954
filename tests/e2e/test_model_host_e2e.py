"""The model host on a live `edge serve`: the three catalog models in one store, a memory budget
that holds any two of them but not all three, and the real clients, unmodified: the `ollama`
package switching models in one session (chat, generate, embed, ps, load and unload by
keep_alive), the OpenAI SDK switching `model` between requests, three requests for three models
at once, and a corrupted file in the store that fails alone."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest

from tests.e2e.conftest import LiveServer, launch

pytestmark = [pytest.mark.e2e, pytest.mark.model]
BUDGET_BYTES = 1300 << 20
GREEDY = {"temperature": 0, "seed": 1, "num_predict": 4}


def _store(root: Path, models: dict[str, Path]) -> None:
    """A model store as `edge pull` leaves it: the files and manifest.json (links, not copies)."""
    root.mkdir(parents=True, exist_ok=True)
    manifest = {}
    for name, path in models.items():
        (root / path.name).symlink_to(path)
        manifest[name] = {"file": path.name, "sha256": "", "source": name}
    bad = root / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 64)  # a header that lies
    manifest["broken"] = {"file": bad.name, "sha256": "", "source": "broken"}
    (root / "manifest.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def server(smollm2_path: Path, gemma_path: Path, qwen_coder_path: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("host")
    _store(tmp / "models", {"smollm2-135m-instruct": smollm2_path, "gemma3-270m": gemma_path,
                            "qwen2.5-coder-0.5b-instruct": qwen_coder_path})
    s = launch(tmp, Path("smollm2-135m-instruct"), "--slots", "2", "--threads", "2",
               "--memory-budget", str(BUDGET_BYTES), "--keep-alive", "5m", "--max-queue", "8")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def client(server: LiveServer) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=300)


def _resident(client: ollama.Client) -> dict[str, int]:
    return {str(m.model): int(m.size or 0) for m in client.ps().models}


def test_the_ollama_client_switches_models_in_one_session(client: ollama.Client) -> None:
    names = {str(m.model) for m in client.list().models}
    assert {"smollm2-135m-instruct:latest", "gemma3-270m:latest",
            "qwen2.5-coder-0.5b-instruct:latest"} <= names
    said = client.chat(model="gemma3-270m", messages=[{"role": "user", "content": "Hi"}], options=GREEDY)
    assert said.done and said.message.content
    made = client.generate(model="qwen2.5-coder-0.5b-instruct", prompt="def add(a, b):", options=GREEDY)
    assert made.done and made.response
    vec = client.embed(model="smollm2-135m-instruct", input="hello")
    assert len(vec.embeddings) == 1 and len(vec.embeddings[0]) > 0
    resident = _resident(client)
    assert sum(resident.values()) <= BUDGET_BYTES
    assert "smollm2-135m-instruct:latest" in resident  # the last one used is resident
    client.generate(model="gemma3-270m", prompt="", keep_alive=0)  # Ollama's unload
    assert "gemma3-270m:latest" not in _resident(client)
    client.generate(model="gemma3-270m", prompt="", keep_alive="2m")  # and load
    assert "gemma3-270m:latest" in _resident(client)


def test_the_openai_sdk_switches_model_between_requests(server: LiveServer) -> None:
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", timeout=300)
    listed = {m.id for m in sdk.models.list().data}
    assert {"smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct"} <= listed
    for model in ("qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma3-270m"):
        out = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, temperature=0)
        assert out.model == model and out.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError, match="gemma3-270m"):
        sdk.chat.completions.create(model="gemma3-27m", messages=[{"role": "user", "content": "Hi"}])


def test_three_models_at_once_under_a_two_model_budget_are_all_answered(client: ollama.Client) -> None:
    answers: dict[str, str] = {}
    over: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            held = sum(_resident(client).values())
            if held > BUDGET_BYTES:
                over.append(held)
            done.wait(0.1)

    def ask(model: str) -> None:
        answers[model] = client.chat(model=model, messages=[{"role": "user", "content": "Hi"}],
                                     options=GREEDY).message.content

    watcher = threading.Thread(target=watch)
    watcher.start()
    workers = [threading.Thread(target=ask, args=(m,)) for m in
               ("smollm2-135m-instruct", "gemma3-270m", "qwen2.5-coder-0.5b-instruct")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(600)
    done.set()
    watcher.join()
    assert len(answers) == 3 and all(answers.values())
    assert over == []


def test_a_corrupted_file_fails_alone_naming_why(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="broken", messages=[{"role": "user", "content": "Hi"}])
    assert "broken" in str(err.value)
    assert client.chat(model="smollm2-135m-instruct", messages=[{"role": "user", "content": "Hi"}],
                       options=GREEDY).done


def test_the_resident_memory_stays_within_the_budget(server: LiveServer, client: ollama.Client) -> None:
    """The process's RSS is its idle self plus the models' planned bytes, never far beyond."""
    import psutil

    proc = psutil.Process(server.proc.pid)
    rss = proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    assert sum(_resident(client).values()) <= BUDGET_BYTES
    assert rss < BUDGET_BYTES * 1.1 + (400 << 20), f"RSS {rss >> 20} MiB"  # + Python, libraries, caches


def test_the_inference_health_check_generates_a_token_on_a_resident_model(server: LiveServer) -> None:
    import httpx

    r = httpx.get(f"{server.url}/health/inference", timeout=60)
    assert r.status_code == 200 and r.json()["latency_ms"] > 0 and r.json()["model"]
    r = httpx.get(f"{server.url}/health/inference", params={"model": "gemma3-270m"}, timeout=120)
    assert r.status_code == 200 and r.json()["model"] == "gemma3-270m"
    assert "edge_inference_probe_latency_seconds" in httpx.get(f"{server.url}/metrics").text
