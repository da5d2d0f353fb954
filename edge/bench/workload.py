"""What each request asks for: prompt length and max_tokens distributions, deterministic prompts.

Specs (`--prompt-lengths`, `--max-tokens`):

- `fixed:N`       always N
- `uniform:A-B`   an integer drawn uniformly from [A, B], both included
- `jsonl:PATH`    prompts only: real requests, one JSON object per line holding either
                  "messages" (a chat) or "prompt" (a string); one is drawn per request

Generated prompts are words from a small built-in list of common English words,
each of which is a single token (with its leading space) in the BPE vocabularies of
SmolLM2, Llama and GPT-2 style tokenizers, so a prompt of N words is about N tokens:
the count is approximate (the chat template adds its own tokens, and other
tokenizers split differently). Request i of a step is drawn from a random generator
seeded with (seed, concurrency, i), so every target of a run gets the very same
requests, a rerun with the same seed repeats them, and consecutive steps do not
resend identical prompts that a prefix cache would answer for free.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edge.bench.tasks import TASKS, task_prompt
from edge.errors import ConfigError

WORDS: tuple[str, ...] = (
    "the", "time", "people", "water", "house", "little", "world", "river", "light", "small",
    "great", "place", "night", "city", "school", "story", "morning", "garden", "friend", "road",
    "tree", "green", "music", "table", "window", "paper", "family", "number", "letter", "country",
    "mountain", "food", "book", "open", "walk", "under", "over", "again", "never", "always",
    "between", "before", "after", "during", "about", "around", "through", "without", "yellow", "blue",
    "red", "black", "white", "warm", "cold", "quiet", "fast", "slow", "happy", "strong",
    "bird", "fish", "horse", "stone", "wind", "rain", "snow", "summer", "winter", "field",
    "ship", "train", "door", "wall", "street", "market", "bread", "milk", "apple", "sun",
    "moon", "star", "sea", "lake", "forest", "hill", "island", "bridge", "church", "castle",
    "king", "child", "woman", "man", "teacher", "doctor", "farmer", "student", "dog", "cat",
)

MAX_VALUE = 1_000_000  # no sane prompt or generation is longer; catches typos like uniform:10-1000000000


@dataclass(frozen=True)
class Dist:
    """A parsed distribution spec; `sample()` draws one integer."""

    kind: Literal["fixed", "uniform", "jsonl"]
    lo: int = 0
    hi: int = 0
    path: Path | None = None
    spec: str = ""

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            return self.lo
        if self.kind == "uniform":
            return rng.randint(self.lo, self.hi)
        raise ValueError("a jsonl distribution holds requests, not lengths")


def _int(text: str, param: str, spec: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(param, f"{spec!r}: {text.strip()!r} is not an integer") from None
    if not 1 <= value <= MAX_VALUE:
        raise ConfigError(param, f"{spec!r}: {value} is out of range 1..{MAX_VALUE}")
    return value


def parse_dist(spec: str, param: str, *, allow_jsonl: bool = False) -> Dist:
    """`fixed:N`, `uniform:A-B` (or `jsonl:PATH` where allowed) -> Dist; ConfigError names the problem."""
    forms = "fixed:N, uniform:A-B" + (" or jsonl:PATH" if allow_jsonl else "")
    kind, sep, rest = spec.partition(":")
    kind = kind.strip().lower()
    if not sep or not rest.strip():
        raise ConfigError(param, f"{spec!r} is not a distribution; expected {forms}")
    if kind == "fixed":
        n = _int(rest, param, spec)
        return Dist("fixed", lo=n, hi=n, spec=spec)
    if kind == "uniform":
        a, dash, b = rest.partition("-")
        if not dash:
            raise ConfigError(param, f"{spec!r}: expected uniform:A-B, e.g. uniform:32-256")
        lo, hi = _int(a, param, spec), _int(b, param, spec)
        if lo > hi:
            raise ConfigError(param, f"{spec!r}: the lower bound {lo} is above the upper bound {hi}")
        return Dist("uniform", lo=lo, hi=hi, spec=spec)
    if kind == "jsonl" and allow_jsonl:
        path = Path(rest.strip()).expanduser()
        if not path.is_file():
            raise ConfigError(param, f"{spec!r}: no such file: {path}")
        return Dist("jsonl", path=path, spec=spec)
    raise ConfigError(param, f"{spec!r}: unknown kind {kind!r}; expected {forms}")


def load_jsonl(path: Path, param: str = "prompt-lengths") -> list[dict[str, Any]]:
    """Records of a jsonl request file, each with "messages" (list of {role, content}) or "prompt"."""
    records: list[dict[str, Any]] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(param, f"{path} line {n}: not JSON ({exc.msg})") from None
        if isinstance(obj, dict) and isinstance(obj.get("messages"), list) and obj["messages"]:
            records.append({"messages": obj["messages"]})
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
            records.append({"prompt": obj["prompt"]})
        else:
            raise ConfigError(param, f"{path} line {n}: needs a non-empty \"messages\" list or a \"prompt\"")
    if not records:
        raise ConfigError(param, f"{path}: no requests in the file")
    return records


def make_prompt(n_tokens: int, rng: random.Random) -> str:
    """About `n_tokens` tokens of text: that many words from WORDS (approximate, see the module doc)."""
    return " ".join(rng.choice(WORDS) for _ in range(n_tokens))


def _as_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)


def end_tokens(model_path: str | Path) -> tuple[int, ...]:
    """The GGUF's end-of-generation token ids (eos, eot, eom) for --ignore-eos."""
    from gguf import GGUFReader

    reader = GGUFReader(str(model_path))
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        field = reader.get_field(key)
        if field is not None:
            ids.append(int(field.parts[field.data[0]][0]))
    return tuple(sorted(set(ids)))


@dataclass(frozen=True)
class RequestSpec:
    """One request's body fields (besides model and stream); `prompt_words` for the record."""

    body: dict[str, Any]
    max_tokens: int
    prompt_words: int | None  # None for a request taken from a jsonl file


class Workload:
    """Request i of the step at `concurrency` for one seed; the same for every target."""

    def __init__(
        self,
        prompt_lengths: Dist,
        max_tokens: Dist,
        *,
        seed: int = 0,
        endpoint: Literal["chat", "completions"] = "chat",
        records: list[dict[str, Any]] | None = None,
        ban_tokens: tuple[int, ...] = (),
        task: str = "words",
    ) -> None:
        if task not in TASKS:
            raise ConfigError("workload", f"{task!r}: expected one of {', '.join(TASKS)}")
        self.task = task
        if prompt_lengths.kind == "jsonl" and records is None:
            assert prompt_lengths.path is not None
            records = load_jsonl(prompt_lengths.path)
        self.prompt_lengths, self.max_tokens = prompt_lengths, max_tokens
        self.seed, self.endpoint, self.records = seed, endpoint, records
        # end-of-generation tokens banned (logit_bias -100, which every OpenAI-style server takes):
        # every target then writes exactly max_tokens, so tokens/s compares like for like
        self.ban_tokens = ban_tokens

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"

    def request(self, concurrency: int, i: int) -> RequestSpec:
        rng = random.Random(f"edge-bench/{self.seed}/{concurrency}/{i}")
        words: int | None = None
        if self.task != "words":  # a task prompt (tasks.py); --prompt-lengths does not apply
            prompt = task_prompt(self.task, rng)
            messages = [{"role": "user", "content": prompt}]
        elif self.records is not None:
            rec = self.records[rng.randrange(len(self.records))]
            messages = rec.get("messages") or [{"role": "user", "content": rec["prompt"]}]
            prompt = rec.get("prompt") or _as_text(rec["messages"])
        else:
            words = self.prompt_lengths.sample(rng)
            prompt = make_prompt(words, rng)
            messages = [{"role": "user", "content": prompt}]
        n_max = self.max_tokens.sample(rng)
        body: dict[str, Any] = {"messages": messages} if self.endpoint == "chat" else {"prompt": prompt}
        body.update(max_tokens=n_max, temperature=0)
        if self.ban_tokens:
            body["logit_bias"] = {str(t): -100 for t in self.ban_tokens}
        return RequestSpec(body=body, max_tokens=n_max, prompt_words=words)
