"""`edge eval MODEL [--against MODEL2 [--prompts [FILE.jsonl]]]`: check a quantization before deploying.

Perplexity comes from the model's own logits over strided windows
(`edge/tools/perplexity.py`); with `--against` the second model is measured on the same
tokens and the relative change is printed, which is how much the other quantization loses.
The default text (`edge/data/eval/`, shipped with the package) is public-domain English
prose of about 8,300 tokens. Perplexity can barely move while answers change, so `--prompts`
also answers every prompt greedily with both models (`edge/tools/answers.py`; the shipped
set when no file is named) and reports the exact-match rate, the agreement up to the first
differing token (mean and worst) and the prompts that changed most.

Exit status: 0 success; 1 the mean agreement is below `--min-agreement`, or any other error
(llama.cpp failed, not enough memory); 2 bad input (unreadable text or prompts, text shorter
than one window, window sizes that do not fit, models with different tokenizations, unknown or
invalid model file, --prompts without --against).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from edge.commands._common import add_settings_args, settings_from_args
from edge.commands.exits import EXIT_FAILED, EXIT_USAGE, USAGE_ERRORS
from edge.errors import InvalidRequest
from edge.tools.answers import DEFAULT_MAX_TOKENS, Answer, Prompt

DEFAULT_CTX = 512
MIN_CTX = 16  # the smallest context edge's settings accept
DEFAULT_TEXT_NAME = "public-domain-prose.txt"
DEFAULT_PROMPTS_NAME = "prompts.jsonl"
_INPUT_ERRORS = USAGE_ERRORS


def default_text() -> Path:
    """The shipped evaluation text (package data, so an installed edge has it too)."""
    return Path(str(resources.files("edge") / "data" / "eval" / DEFAULT_TEXT_NAME))


def default_prompts() -> Path:
    """The shipped prompt set for `--prompts` (package data)."""
    return Path(str(resources.files("edge") / "data" / "eval" / DEFAULT_PROMPTS_NAME))


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value}")
    return value


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="perplexity over a text; compare two quantizations of a model")
    p.add_argument("model", help="store name or .gguf path")
    p.add_argument("--text", type=Path, default=None,
                   help=f"UTF-8 text file to score (default: the shipped {DEFAULT_TEXT_NAME}, ~8.3k tokens)")
    p.add_argument("--against", default=None, metavar="MODEL2",
                   help="also score MODEL2 on the same tokens and print the relative change in PPL "
                        "(same tokenizer required)")
    p.add_argument("--ctx", type=_at_least(MIN_CTX), default=DEFAULT_CTX,
                   help=f"window length in tokens (default {DEFAULT_CTX})")
    p.add_argument("--stride", type=_at_least(1), default=None,
                   help="tokens a window advances; each scores the tokens the previous one did not "
                        "(default: ctx/2)")
    p.add_argument("--threads", type=_at_least(1), default=None,
                   help="llama.cpp threads (default: usable CPUs)")
    p.add_argument("--prompts", type=Path, nargs="?", const=default_prompts(), default=None,
                   metavar="FILE.jsonl", help="with --against, also answer each prompt greedily with both "
                   "models and compare the answers (default: the shipped set of 16 chat prompts)")
    p.add_argument("--max-tokens", type=_at_least(1), default=DEFAULT_MAX_TOKENS,
                   help=f"longest answer per prompt (default {DEFAULT_MAX_TOKENS}; a prompt's own "
                   "max_tokens wins)")
    p.add_argument("--min-agreement", type=_fraction, default=None, metavar="F",
                   help="with --prompts, exit 1 when the mean agreement is below F (0-1)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_settings_args(p)
    p.set_defaults(func=run)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read --text {path}: {exc}", "text") from exc


class _Bar:
    """A tqdm bar over scored tokens on a terminal; nothing otherwise (quiet in logs and CI)."""

    def __init__(self, desc: str, enabled: bool, unit: str = "tok") -> None:
        self.desc, self.enabled, self.bar, self.done, self.unit = desc, enabled, None, 0, unit

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=self.desc, unit=self.unit, file=sys.stderr, leave=False)
        self.bar.update(done - self.done)
        self.done = done

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _prepare(ref: str, settings: Any) -> tuple[Path, int]:
    """Resolve, validate and memory-plan a model: (path, GPU layers). llama.cpp never opens a
    file edge has not validated, nor gets a context that does not fit."""
    from edge.errors import InsufficientMemory
    from edge.host.loading import plan_for

    path, plan = plan_for(ref, settings)
    if not plan.fits:
        raise InsufficientMemory(plan.total_bytes, plan.available_bytes, f"{path.name} ({plan.reason})")
    return path, int(plan.n_gpu_layers)


def evaluate_models(args: argparse.Namespace, text: str, *, prepare: Callable[[str, Any], tuple[Path, int]],
                    evaluate: Callable[..., Any], check_vocab: Callable[[Path, Path, str], None],
                    progress: bool, prompts: list[Prompt] | None = None,
                    answer: Callable[..., list[Answer]] | None = None) -> dict[str, Any]:
    """Score MODEL (and MODEL2; with `prompts`, compare their greedy answers too) and return the
    JSON document. Raises the runtime's typed errors."""
    n_ctx = args.ctx
    stride = args.stride if args.stride is not None else max(1, n_ctx // 2)
    settings = settings_from_args(args, n_ctx=n_ctx, slots=1, threads=args.threads)
    n_threads = args.threads or settings.threads or _usable_cpus()
    path, ngl = prepare(args.model, settings)
    other = prepare(args.against, settings) if args.against else None
    if other is not None:
        check_vocab(path, other[0], text)  # before any decoding: a mismatch is bad input
    results = []
    for p, layers in [(path, ngl)] + ([other] if other else []):
        bar = _Bar(p.name, progress)
        try:
            results.append(evaluate(p, text, n_ctx=n_ctx, stride=stride, n_threads=n_threads,
                                    n_gpu_layers=layers, progress=bar))
        finally:
            bar.close()
    doc: dict[str, Any] = {
        "text": str(args.text or default_text()),
        "n_ctx": n_ctx,
        "stride": stride,
        "n_threads": n_threads,
        "model": results[0].to_dict(),
        "against": results[1].to_dict() if len(results) > 1 else None,
        "ppl_change_pct": None,
    }
    if len(results) > 1:
        from edge.tools.perplexity import relative_change_pct

        doc["ppl_change_pct"] = relative_change_pct(results[0].ppl, results[1].ppl)
    if prompts is not None and other is not None and answer is not None:
        doc["answers"] = _compare_answers(args, prompts, [(path, ngl), other], n_threads, answer, progress)
    return doc


def _compare_answers(args: argparse.Namespace, prompts: list[Prompt], models: list[tuple[Path, int]],
                     n_threads: int, answer: Callable[..., list[Answer]], progress: bool) -> dict[str, Any]:
    """Both models' greedy answers to every prompt, compared token by token."""
    from edge.tools.answers import compare

    answers = []
    for p, layers in models:
        bar = _Bar(f"{p.name} answers", progress, unit="prompt")
        try:
            answers.append(answer(p, prompts, n_threads=n_threads, n_gpu_layers=layers, progress=bar))
        finally:
            bar.close()
    return {"prompts": str(args.prompts), **compare(prompts, answers[0], answers[1])}


def render(doc: dict[str, Any]) -> str:
    """The text form: one column per model, then the relative change."""
    cols = [doc["model"]] + ([doc["against"]] if doc["against"] else [])
    rows = [
        ("model", [c["model"] for c in cols]),
        ("tokens scored", [f"{c['n_scored']} of {c['n_tokens']}" for c in cols]),
        ("perplexity", [f"{c['ppl']:.4f}" for c in cols]),
        ("mean NLL (nats)", [f"{c['mean_nll']:.5f}" for c in cols]),
        ("time", [f"{c['eval_s']:.1f} s ({c['n_decoded'] / max(c['eval_s'], 1e-9):.0f} tok/s)"
                  for c in cols]),
    ]
    width = max(14, *(len(v) for _, vals in rows for v in vals))
    lines = [f"text {doc['text']}, windows of {doc['n_ctx']} tokens every {doc['stride']}, "
             f"{doc['n_threads']} thread{'s' if doc['n_threads'] != 1 else ''}"]
    lines += [f"{label:<17}" + "  ".join(f"{v:<{width}}" for v in vals).rstrip() for label, vals in rows]
    if doc["ppl_change_pct"] is not None:
        lines.append(f"PPL change of {cols[1]['model']} vs {cols[0]['model']}: "
                     f"{doc['ppl_change_pct']:+.2f} %")
    if doc.get("answers"):
        lines += render_answers(doc["answers"])
    return "\n".join(lines)


def _clip(text: str, width: int = 60) -> str:
    one = " ".join(text.split())
    return repr(one if len(one) <= width else one[:width - 1] + "…")


def render_answers(a: dict[str, Any]) -> list[str]:
    """The answer comparison: the rates, then the prompts whose answers changed most."""
    lines = [f"greedy answers to {a['n_prompts']} prompts ({a['prompts']}): exact match "
             f"{a['exact_match_rate']:.1%}, agreement to the first differing token mean "
             f"{a['agreement_mean']:.3f}, worst {a['agreement_worst']:.3f}"]
    if a["changed_most"]:
        lines.append("changed most (agreement, first differing token):")
    for c in a["changed_most"]:
        lines.append(f"  {c['id']:<24} {c['agreement']:.3f} at token {c['first_difference']}")
        lines.append(f"    A {_clip(c['a'])}")
        lines.append(f"    B {_clip(c['b'])}")
    return lines


def _prompts(args: argparse.Namespace) -> list[Prompt] | None:
    """The prompts to answer (read before any model loads: a bad file is bad input), or None."""
    from edge.tools.answers import load_prompts

    if args.prompts is None:
        if args.min_agreement is not None:
            raise InvalidRequest("--min-agreement needs --prompts", "min_agreement")
        return None
    if not args.against:
        raise InvalidRequest("--prompts compares two models' answers: give --against MODEL2", "prompts")
    return load_prompts(args.prompts, args.max_tokens)


def run(args: argparse.Namespace, *, out: TextIO | None = None, err: TextIO | None = None,
        prepare: Callable[[str, Any], tuple[Path, int]] | None = None,
        evaluate: Callable[..., Any] | None = None,
        check_vocab: Callable[[Path, Path, str], None] | None = None,
        answer: Callable[..., list[Answer]] | None = None) -> int:
    """Loaders are parameters (production defaults) so the exit statuses are testable without
    llama.cpp."""
    out = out or sys.stdout
    err = err or sys.stderr
    try:
        text = _read_text(args.text or default_text())
        prompts = _prompts(args)
        if prepare is None:
            prepare = _prepare
        if evaluate is None or check_vocab is None:
            from edge.tools import perplexity

            evaluate = evaluate or perplexity.evaluate
            check_vocab = check_vocab or perplexity.check_same_vocab
        if answer is None:
            from edge.tools.answers import greedy_answers as answer
        doc = evaluate_models(args, text, prepare=prepare, evaluate=evaluate, check_vocab=check_vocab,
                              progress=err.isatty(), prompts=prompts, answer=answer)
    except _INPUT_ERRORS as exc:
        print(f"edge eval: error: {exc}", file=err)
        return EXIT_USAGE
    print(json.dumps(doc, indent=2) if args.json else render(doc), file=out)
    floor, answers = args.min_agreement, doc.get("answers")
    if floor is not None and answers is not None and answers["agreement_mean"] < floor:
        print(f"edge eval: mean agreement {answers['agreement_mean']:.3f} is below --min-agreement "
              f"{floor}", file=err)
        return EXIT_FAILED
    return 0
