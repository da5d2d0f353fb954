"""Fuzz campaign: mutants of a real GGUF through `validate_gguf` and `edge inspect`.

The cases run in a child process (`python -m tests.gguf_fuzz MODEL`) that prints
one JSON line as each case starts and one as it ends; the parent (`run_campaign`)
reads them under a watchdog, so a hang, even one stuck in C, is killed and named,
and a crash or a child that dies reports its seed, case and mutation. One case
reruns alone with `python -m tests.gguf_fuzz MODEL --seed S --first CASE --cases 1`.

Per case the validator must accept the file (then `GGUFInfo` must be consistent
with the file) or raise `InvalidGGUF` naming the file with a one-line reason;
anything else is a crash. A sample also goes through `edge inspect`, which must
exit 0 for an accepted file and 2 with one `edge: error:` line for a rejected one.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.gguf_mutator import Layout, Mutation, mutation, read_layout

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TARGET = "edge.gguf:validate_gguf"


class MutantFile:
    """A private copy of the model, patched in place per case and restored after it.

    The copy is made once; a case writes a few bytes of the head and puts the
    originals back, so 1,000 cases cost 1,000 small writes, not 1,000 copies. A
    truncated mutant is a second file: the (patched) head, then sparse bytes up
    to the cut, since the validator reads the data section only through sizes.
    """

    def __init__(self, src: Path, workdir: Path, layout: Layout) -> None:
        self.layout = layout
        self.full = workdir / "mutant.gguf"
        self.cut = workdir / "mutant-cut.gguf"
        shutil.copyfile(src, self.full)
        self._undo: list[tuple[int, bytes]] = []

    def write(self, m: Mutation) -> Path:
        head = self.layout.head
        assert all(pos + len(b) <= len(head) for pos, b in m.patches), m
        if m.truncate_at is not None:
            data = bytearray(head[: min(m.truncate_at, len(head))])
            for pos, b in m.patches:
                data[pos : pos + len(b)] = b
            with open(self.cut, "wb") as f:
                f.write(bytes(data[: m.truncate_at]))
                f.truncate(m.truncate_at)
            return self.cut
        with open(self.full, "r+b") as f:
            for pos, b in m.patches:
                self._undo.append((pos, head[pos : pos + len(b)]))
                f.seek(pos)
                f.write(b)
        return self.full

    def remove(self) -> None:
        """Delete the copies (a model-sized file must not outlive the campaign)."""
        self.full.unlink(missing_ok=True)
        self.cut.unlink(missing_ok=True)

    def restore(self) -> None:
        with open(self.full, "r+b") as f:
            for pos, b in reversed(self._undo):
                f.seek(pos)
                f.write(b)
        self._undo.clear()


def sanity_problems(info: Any, path: Path) -> list[str]:
    """What is inconsistent in an accepted file's GGUFInfo (nothing, for a sane one)."""
    from edge.gguf import info_to_json

    size = path.stat().st_size
    problems = []
    if info.file_size_bytes != size:
        problems.append(f"file_size_bytes {info.file_size_bytes} != {size}")
    if info.data_offset > size or info.data_offset % info.alignment:
        problems.append(f"data_offset {info.data_offset} outside the file or misaligned")
    bad = [t.name for t in info.tensors if t.offset < info.data_offset or t.offset + t.n_bytes > size]
    if bad:
        problems.append(f"tensors outside the data section: {bad[:3]}")
    if len(info.swa_layers) != info.n_layer:
        problems.append(f"{len(info.swa_layers)} SWA flags for {info.n_layer} layers")
    if info.kv_bytes_per_token("f16") < 0 or info.weights_bytes > size:
        problems.append("negative KV bytes or weights larger than the file")
    json.dumps(info_to_json(info))
    return problems


def inspect_problem(path: Path, accepted: bool, extra: list[str]) -> str | None:
    """Run `edge inspect` in-process; None when it exits as documented for this file."""
    from edge.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["inspect", str(path), *extra])
    lines = err.getvalue().strip().splitlines()
    if accepted:
        ok = rc == 0 and out.getvalue().strip()
        return None if ok else f"inspect exit {rc} on an accepted file: {lines}"
    want = f"edge: error: invalid GGUF file {path}: "
    if rc != 2 or len(lines) != 1 or not lines[0].startswith(want) or out.getvalue():
        return f"inspect exit {rc} on a rejected file, stderr {lines!r}"
    return None


def _one_line(text: str) -> bool:
    return bool(text) and len(text.splitlines()) == 1 and all(c.isprintable() for c in text)


def run_case(files: MutantFile, seed: int, case: int, validate: Callable[[Path], Any],
             inspect_every: int) -> dict[str, Any]:
    """Apply case `case`, judge the validator (and maybe `edge inspect`) on it, restore the file."""
    from edge.errors import InvalidGGUF

    m = mutation(files.layout, seed, case)
    rec: dict[str, Any] = {"case": case, "kind": m.kind, "detail": m.detail}
    path = files.write(m)
    t0 = time.perf_counter()
    try:
        try:
            info = validate(path)
        except InvalidGGUF as exc:
            rec.update(outcome="rejected", reason=exc.reason)
            if exc.path != str(path) or not _one_line(str(exc)):
                rec["problem"] = f"rejection does not name the file on one printable line: {str(exc)[:300]!r}"
        else:
            rec.update(outcome="accepted")
            if problems := sanity_problems(info, path):
                rec["problem"] = f"accepted with an inconsistent GGUFInfo: {problems}"
        rec["ms"] = round((time.perf_counter() - t0) * 1000, 2)
        accepted = rec["outcome"] == "accepted"
        if inspect_every and (accepted or case % inspect_every == 0) and "problem" not in rec:
            extra = [["--json"], [], ["--tensors"]][case % 3]
            rec["inspected"] = True
            if problem := inspect_problem(path, accepted, extra):
                rec["problem"] = problem
    except Exception as exc:  # anything but InvalidGGUF escaping is the bug the fuzzer looks for
        rec.update(outcome="crash", error=f"{type(exc).__name__}: {exc}"[:500],
                   traceback=traceback.format_exc(limit=-6))
    finally:
        files.restore()
    return rec


def _child(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.gguf_fuzz")
    p.add_argument("model", type=Path)
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--first", type=int, default=0, help="first case index (rerun one case)")
    p.add_argument("--seed", type=int, default=34)
    p.add_argument("--inspect-every", type=int, default=5,
                   help="every accepted and every Nth rejected mutant also through `edge inspect` (0: none)")
    p.add_argument("--target", default=DEFAULT_TARGET, help="module:function validating a path")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    module, func = args.target.split(":")
    validate = getattr(importlib.import_module(module), func)
    with tempfile.TemporaryDirectory(prefix="gguf-fuzz-") as tmp:
        files = MutantFile(args.model, args.workdir or Path(tmp), read_layout(args.model))
        try:
            for case in range(args.first, args.first + args.cases):
                print(json.dumps({"start": case}), flush=True)
                rec = run_case(files, args.seed, case, validate, args.inspect_every)
                print(json.dumps(rec), flush=True)
        finally:
            files.remove()
    print(json.dumps({"done": True}), flush=True)
    return 0


_NUMBER = re.compile(r"\b\d+\b")
_QUOTED = re.compile(r"b?'[^']*'")


def reason_class(reason: str) -> str:
    """A rejection reason without its numbers and names, to count reasons by kind."""
    return _NUMBER.sub("N", _QUOTED.sub("'…'", reason))[:90]


@dataclass
class Report:
    """What a campaign found; `summary()` is printed by the test."""

    model: str
    seed: int
    cases: int = 0
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    accepted_kinds: Counter[str] = field(default_factory=Counter)
    inspected: int = 0
    slowest_ms: float = 0.0
    failures: list[str] = field(default_factory=list)  # crashes, hangs, wrong rejections, bad inspect

    def add(self, rec: dict[str, Any], hang_s: float) -> None:
        self.cases += 1
        self.outcomes[rec["outcome"]] += 1
        self.kinds[rec["kind"].split(".")[0]] += 1
        self.inspected += bool(rec.get("inspected"))
        self.slowest_ms = max(self.slowest_ms, rec.get("ms", 0.0))
        where = f"seed {self.seed} case {rec['case']} ({rec['kind']}: {rec['detail']})"
        if rec["outcome"] == "rejected":
            self.reasons[reason_class(rec["reason"])] += 1
        elif rec["outcome"] == "accepted":
            self.accepted_kinds[rec["kind"]] += 1
        if rec["outcome"] == "crash":
            self.failures.append(f"CRASH {where}: {rec['error']}\n{rec['traceback']}")
        if "problem" in rec:
            self.failures.append(f"WRONG {where}: {rec['problem']}")
        if rec.get("ms", 0.0) > hang_s * 1000:
            self.failures.append(f"HANG {where}: took {rec['ms']:.0f} ms")

    def summary(self) -> str:
        lines = [
            f"gguf fuzz: {self.cases} mutants of {self.model} (seed {self.seed}) in {self.seconds:.1f} s: "
            f"{self.outcomes['rejected']} rejected, {self.outcomes['accepted']} accepted, "
            f"{self.outcomes['crash']} crashed; {self.inspected} also through `edge inspect`; "
            f"slowest case {self.slowest_ms:.0f} ms; {len(self.failures)} failures",
            "mutations: " + ", ".join(f"{k} {n}" for k, n in self.kinds.most_common()),
            "accepted (harmless) mutations: "
            + ", ".join(f"{k} {n}" for k, n in self.accepted_kinds.most_common(8)),
            f"rejected by reason ({len(self.reasons)} kinds):",
            *(f"  {n:5d}  {r}" for r, n in self.reasons.most_common(25)),
        ]
        rare = self.reasons.most_common()[25:]
        if rare:
            lines.append(f"  ({len(rare)} rarer kinds, {sum(n for _, n in rare)} cases)")
        return "\n".join(lines + self.failures[:10])


def run_campaign(model: Path, workdir: Path, *, cases: int = 1000, seed: int = 34, hang_s: float = 5.0,
                 inspect_every: int = 5, target: str = DEFAULT_TARGET, start_s: float = 60.0) -> Report:
    """Run the cases in a child process under a watchdog: no line for `hang_s` x 2 is a hang."""
    cmd = [sys.executable, "-m", "tests.gguf_fuzz", str(model), "--cases", str(cases), "--seed", str(seed),
           "--inspect-every", str(inspect_every), "--target", target, "--workdir", str(workdir)]
    report = Report(model.name, seed)
    lines: queue.Queue[str | None] = queue.Queue()
    t0 = time.perf_counter()
    with open(workdir / "child-stderr.txt", "w+") as err:
        child = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True)
        threading.Thread(target=_pump, args=(child, lines), daemon=True).start()
        try:
            ended, started = _follow(report, lines, hang_s, start_s)
        finally:
            child.kill()
            child.wait()
            for copy in workdir.glob("mutant*.gguf"):  # a killed child leaves its model-sized copy
                copy.unlink()
        err.seek(0)
        tail = err.read()[-2000:]
    report.seconds = time.perf_counter() - t0
    what = f"seed {seed} case {started}" if started is not None else "start-up"
    if ended == "hang":
        report.failures.append(f"HANG {what}: no answer within {hang_s * 2:.0f} s (child killed)")
    elif ended == "died":
        report.failures.append(f"CRASH {what}: the child died (exit {child.returncode}): {tail}")
    return report


def _pump(child: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        lines.put(line)
    lines.put(None)


def _follow(report: Report, lines: queue.Queue[str | None], hang_s: float,
            start_s: float) -> tuple[str, int | None]:
    """Read the child's lines into `report`; ("done" | "hang" | "died", the case last started)."""
    started: int | None = None
    while True:
        try:
            line = lines.get(timeout=start_s if started is None else hang_s * 2)
        except queue.Empty:
            return "hang", started
        if line is None:
            return "died", started
        if not line.startswith("{"):
            continue  # not ours: something in the child wrote to stdout
        rec = json.loads(line)
        if rec.get("done"):
            return "done", started
        if "start" in rec:
            started = rec["start"]
            continue
        report.add(rec, hang_s)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
