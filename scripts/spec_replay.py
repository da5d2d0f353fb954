"""Replay drafting rules over recorded greedy answers: how many steps and how much verify time each
rule would spend on the bench's own requests, without a server in the loop.

    .venv/bin/python scripts/spec_replay.py MODEL.gguf [--threads 2] [--tasks summarise,rewrite,quote,story]

First (once per model, cached next to --cache) every distinct request of `edge bench http
--workload TASK` is answered greedily (at most 200 tokens, as scripts/bench_speculative.py asks)
and the verify-step cost curve (1..32 tokens, 300 cells deep, `--flash-attn` kind: off by
default, what edge picks on the CPUs measured so far) is timed on this machine.
Then each rule drafts against the recorded answers: a draft is accepted up to its first
token that differs from the answer, exactly as greedy verification would, and a step of n
tokens costs the measured cost(n). Printed per task: decode time relative to one token per
step (lower is better) and the mean accepted tokens per step. Rules: `edge` is the engine's own
code path (spec_step.Speculation with speculative.choose_drafts, one per task as in a server;
`edge-kK` with another --draft-max); `ls-ngram-N-M` is llama-server's
ngram-simple drafting (common_ngram_simple_draft: the last N tokens looked up, M drafted
whenever found).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edge.bench.tasks import CODE, DOCUMENTS, QUESTIONS, RENAMES, TOPICS
from edge.config import DEFAULT_DRAFT_MAX
from edge.runtime.llama import attention
from edge.runtime.spec.rules import StepCost, choose_drafts
from edge.runtime.spec.state import Speculation

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 200


def task_prompts(task: str) -> list[str]:
    """Every distinct user message `edge.bench.tasks.task_prompt` can draw for `task`."""
    if task == "summarise":
        lead = "Summarise the following report in a few sentences, using its own words."
        return [f"{lead}\n\n{d}" for d in DOCUMENTS]
    if task == "rewrite":
        return [(f"Rewrite this code, renaming `{a}` to `{b}` everywhere. Reply with the whole code "
                 f"and nothing else.\n\n{code}") for code in CODE for a, b in RENAMES if a in code]
    if task == "quote":
        return [(f"Answer the question by quoting the passage's own sentences.\n\nPassage:\n{DOCUMENTS[i]}"
                 f"\n\nQuestion: {q}") for i, q in QUESTIONS]
    if task == "story":
        return [f"Write a short story about {t}." for t in TOPICS]
    raise ValueError(task)


def record(model_path: str, tasks: Sequence[str], threads: int) -> dict:
    """Greedy answers (token ids) of every request."""
    import llama_cpp
    import numpy as np

    from edge.runtime.llama.batch import Batch
    from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel
    from edge.runtime.text.chat_template import load_template

    model = LlamaModel(model_path)
    tpl = load_template(model.chat_template(), model.token_text(model.bos_id), model.token_text(model.eos_id))
    ctx = LlamaContext(model, ContextConfig(n_ctx=4096, n_seq_max=1, n_threads=threads, n_outputs_max=16))
    ctx.warm_up(model)
    batch = Batch(1024)
    out: dict = {"tasks": {}}

    def argmax(row: int) -> int:
        ptr = llama_cpp.llama_get_logits_ith(ctx.ptr, row)
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                                   shape=(model.n_vocab,))))

    for task in tasks:
        rows = []
        for text in task_prompts(task):
            chat = tpl.render([{"role": "user", "content": text}], True)
            prompt = model.tokenize(chat, add_bos=model.add_bos)
            ctx.clear()
            batch.clear()
            batch.add_prompt(0, prompt, 0, logits_last=True)
            assert batch.decode(ctx.ptr) == 0
            answer = [argmax(-1)]
            while len(answer) < MAX_TOKENS and not model.is_eog(answer[-1]):
                batch.clear()
                batch.add_token(0, answer[-1], len(prompt) + len(answer) - 1)
                assert batch.decode(ctx.ptr) == 0
                answer.append(argmax(0))
            rows.append({"prompt": prompt, "answer": answer})
            print(f"  {task}: {len(prompt)} prompt tokens, {len(answer)} answer tokens", flush=True)
        out["tasks"][task] = rows
    batch.free()
    ctx.close()
    model.close()
    return out


def cost_curve(model_path: str, threads: int, flash_attn: bool | None, depth: int = 300) -> dict[int, float]:
    """Seconds of a verify step of n = 1..32 tokens at `depth` cells (fastest of 7)."""
    import llama_cpp

    from edge.runtime.llama.batch import Batch
    from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel

    model = LlamaModel(model_path)
    ctx = LlamaContext(model, ContextConfig(n_ctx=4096, n_seq_max=1, n_threads=threads, n_outputs_max=32,
                                            flash_attn=flash_attn))
    ctx.warm_up(model)
    batch = Batch(1024)
    filler = [(i * 7919) % (model.n_vocab - 10) + 5 for i in range(depth)]
    batch.add_prompt(0, filler, 0, logits_last=False)
    assert batch.decode(ctx.ptr) == 0
    out = {}
    for n in range(1, 33):
        best = float("inf")
        for _ in range(7):
            batch.clear()
            batch.add_tokens(0, filler[:n], depth)
            t0 = time.perf_counter()
            assert batch.decode(ctx.ptr) == 0
            llama_cpp.llama_synchronize(ctx.ptr)
            best = min(best, time.perf_counter() - t0)
            ctx.seq_rm(0, depth, -1)
        out[n] = best
    batch.free()
    ctx.close()
    model.close()
    return out


# --- rules -------------------------------------------------------------------------------
# A rule is a factory: (prompt, cost) -> (propose() -> draft, emitted(tokens, n_drafted, n_accepted)).
Rule = Callable[[list[int], StepCost], tuple[Callable[[], list[int]], Callable[[list[int], int, int], None]]]


def edge_rule(k: int) -> Rule:
    """The engine's own path; one Speculation for all requests of a task, as in a server (what
    it learns from one request is the next one's prior)."""
    spec = Speculation("ngram", k)

    def make(prompt: list[int], cost: StepCost):
        spec.cost = cost
        sp = spec.state_for(prompt, None, None)
        assert sp is not None
        specs = {0: sp}

        def propose() -> list[int]:
            asks, table, tok_s = spec.view([(0, sp, 10_000)], None)
            drafts = choose_drafts(asks, 1, StepCost.from_table(table), tok_s)
            spec.apply(tuple(drafts.items()), specs)
            return list(sp.draft)

        def emitted(tokens: list[int], n_drafted: int, n_acc: int) -> None:
            for t in tokens:
                sp.commit(t)
            spec.settle(sp, n_acc)

        return propose, emitted

    return make


def ls_ngram_rule(n: int, m: int) -> Rule:
    def make(prompt: list[int], cost: StepCost):
        toks = list(prompt)

        def propose() -> list[int]:
            cur = len(toks)
            if cur <= n + m + 1:
                return []
            pat = toks[cur - n :]
            for j in range(cur - n - 1, 0, -1):
                if toks[j : j + n] == pat:
                    copy = min(m, cur - (j + n))
                    return toks[j + n : j + n + copy] if copy >= n else []
            return []

        def emitted(tokens: list[int], n_drafted: int, n_acc: int) -> None:
            toks.extend(tokens)

        return propose, emitted

    return make


def replay(rule: Rule, prompt: list[int], answer: list[int], cost: StepCost) -> tuple[float, int, int, int]:
    """(decode seconds, steps, drafted, accepted) of `answer` under `rule`; the first token comes
    from the prompt's own step and is not counted."""
    propose, emitted = rule(prompt, cost)
    emitted([answer[0]], 0, 0)
    i, secs, steps, drafted, accepted = 1, 0.0, 0, 0, 0
    while i < len(answer):
        draft = propose()
        a = 0
        while a < len(draft) and i + a < len(answer) and draft[a] == answer[i + a]:
            a += 1
        out = answer[i : i + a + 1]
        secs += cost.cost(1 + len(draft))
        steps += 1
        drafted += len(draft)
        accepted += a
        emitted(out, len(draft), a)
        i += len(out)
    return secs, steps, drafted, accepted


RULES: dict[str, Callable[[], Rule]] = {
    "edge": lambda: edge_rule(DEFAULT_DRAFT_MAX),
    "edge-k8": lambda: edge_rule(8),
    "edge-k24": lambda: edge_rule(24),
    "ls-ngram-3-8": lambda: ls_ngram_rule(3, 8),
    "ls-ngram-12-48": lambda: ls_ngram_rule(12, 48),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tasks", default="summarise,rewrite,quote,story")
    ap.add_argument("--cache", default=str(ROOT / ".cache" / "spec-replay"))
    ap.add_argument("--rules", default=",".join(RULES))
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="off",
                    help="the attention kind whose verify costs are timed (edge measures which is faster)")
    args = ap.parse_args()
    tasks = args.tasks.split(",")
    path = Path(args.cache) / (Path(args.model).stem + ".json")
    if path.is_file():
        data = json.loads(path.read_text())
    else:
        data = record(args.model, tasks, args.threads)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    key = f"cost32-{args.flash_attn}-{args.threads}"
    if key not in data:
        data[key] = cost_curve(args.model, args.threads, attention.fixed_choice(args.flash_attn))
        path.write_text(json.dumps(data))
    cost = StepCost.from_table([(int(n), s) for n, s in data[key].items()])
    print("cost x1:", " ".join(f"{n}:{cost.cost(n) / cost.cost(1):.2f}" for n in range(1, 33)))
    print(f"{'rule':<16}" + "".join(f"{t:>22}" for t in tasks))
    for name in args.rules.split(","):
        cells = []
        for task in tasks:
            rel, runs = [], []
            rule = RULES[name]()
            for row in data["tasks"][task]:
                secs, steps, _, acc = replay(rule, row["prompt"], row["answer"], cost)
                plain = (len(row["answer"]) - 1) * cost.cost(1)
                rel.append(secs / plain if plain else 1.0)
                runs.append(acc / steps if steps else 0.0)
            cells.append(f"{statistics.mean(rel):8.3f} ({statistics.mean(runs):4.2f} acc/st)")
        print(f"{name:<16}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    main()
