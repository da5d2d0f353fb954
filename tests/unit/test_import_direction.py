"""The packages import in the direction the data flows, never back up.

Every `import X` / `from X import` in the package is read with `ast`, lazy imports inside
functions and TYPE_CHECKING blocks included, so a dependency that only shows up at run time
on some platform is caught too. Rules: the FORBIDDEN table (layers), no cycle between edge's
top-level packages and modules, leaf contracts, and two native or web stacks kept in their
rooms (llama_cpp in runtime/llama and tools, FastAPI and Starlette in api). Each rule has a
test that shows its check can fail.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

EDGE = Path(__file__).resolve().parents[2] / "edge"

# package -> edge packages it must never import ("*": none at all)
_ABOVE_RUNTIME = {"api", "scheduler", "service", "sim", "commands", "bench", "host", "tools"}
FORBIDDEN: dict[str, set[str]] = {
    "contracts": {"*"},  # leaf types every layer may name
    "platforms": {"*"},  # platform detection stands alone
    "dirs": {"*"},  # where caches live: a leaf every layer may ask
    "telemetry": {"runtime", "api", "sim", "scheduler", "service", "commands", "probe", "config", "host"},
    "probe": {"runtime", "api", "sim", "scheduler", "service", "commands", "host"},
    # the runtime gets one EngineConfig from the host: no settings, store, planner, probe or GGUF checks
    "runtime": _ABOVE_RUNTIME | {"config", "store", "planner", "probe", "gguf", "telemetry"},
    "scheduler": {"api", "service", "sim", "commands", "bench", "runtime", "config", "host"},
    "api": {"service", "sim", "commands", "bench", "tools"},
    # the model host resolves references and plans memory above the runtime, below api/service/commands
    "host": {"api", "service", "commands", "sim", "bench", "scheduler", "tools"},
    "tools": {"api", "service", "commands", "sim", "scheduler", "bench", "host"},
    "config": {"runtime", "api", "scheduler", "service", "sim", "telemetry", "commands", "host", "store"},
    "gguf": {"runtime", "api", "scheduler", "service", "sim", "telemetry", "commands", "host", "config"},
    "planner": {"runtime", "api", "scheduler", "service", "sim", "telemetry", "commands", "host", "config"},
    "planner_terms": {"runtime", "api", "scheduler", "service", "sim", "telemetry", "commands", "host",
                      "config"},
    "store_fetch": {"runtime", "api", "scheduler", "service", "sim", "telemetry", "commands", "host",
                    "planner"},
}

# third-party package -> the edge rooms that may import it (paths relative to edge/)
CONFINED: dict[str, tuple[str, ...]] = {
    "llama_cpp": ("runtime/llama", "tools"),  # the rest takes it from edge.runtime.llama
    "fastapi": ("api",),
    "starlette": ("api",),
    "sse_starlette": ("api",),
}


def _package(path: Path, root: Path = EDGE) -> str:
    return path.relative_to(root).parts[0].removesuffix(".py")


def _imported(path: Path) -> Iterator[str]:
    """Every absolute module name `path` imports, anywhere in it."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module


def edge_imports(path: Path) -> set[str]:
    """Top-level edge packages a module imports (relative imports stay inside the package)."""
    return {n.split(".")[1] for n in _imported(path) if n.startswith("edge.")}


def _violations(root: Path = EDGE, rules: dict[str, set[str]] = FORBIDDEN) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        pkg = _package(path, root)
        rule = rules.get(pkg)
        if rule is None:
            continue
        for target in edge_imports(path) - {pkg}:
            if "*" in rule or target in rule:
                bad.append(f"{path.relative_to(root.parent)} imports edge.{target}")
    return bad


def confinement_violations(root: Path = EDGE) -> list[str]:
    """Files outside a package's rooms (CONFINED) that import it."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for top in {n.split(".")[0] for n in _imported(path)} & CONFINED.keys():
            if not any(rel.startswith(room + "/") or rel == room + ".py" for room in CONFINED[top]):
                bad.append(f"{rel} imports {top}")
    return bad


def package_graph(root: Path = EDGE) -> dict[str, set[str]]:
    """Top-level package or module -> the others it imports."""
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        pkg = _package(path, root)
        graph.setdefault(pkg, set()).update(edge_imports(path) - {pkg})
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "edge" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "edge"


def test_no_package_imports_one_above_it() -> None:
    assert _violations() == []


def test_the_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edge.api import app\n"
                   "def f():\n    import edge.sim.device\n    from . import sibling\n")
    assert edge_imports(mod) == {"api", "sim"}


def test_the_layer_check_fails_on_a_runtime_that_reads_settings(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"runtime/engine/core.py": "def f():\n    from edge.config import Settings\n",
                            "contracts/engine.py": "import edge.errors\n"})
    assert _violations(root) == ["edge/contracts/engine.py imports edge.errors",
                                 "edge/runtime/engine/core.py imports edge.config"]


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_every_ruled_package_exists(pkg: str) -> None:
    assert (EDGE / pkg).is_dir() or (EDGE / f"{pkg}.py").is_file()


def test_contracts_import_nothing_of_edge() -> None:
    assert FORBIDDEN["contracts"] == {"*"}
    assert {p.name: edge_imports(p) for p in (EDGE / "contracts").rglob("*.py") if edge_imports(p)} == {}


def test_no_cycle_between_edge_packages() -> None:
    assert cycles(package_graph()) == []


def test_the_cycle_check_sees_a_cycle_through_lazy_imports(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "config.py": "def check():\n    from edge.runtime.text import chat_template\n",
        "runtime/core.py": "import typing\nif typing.TYPE_CHECKING:\n    from edge.store import x\n",
        "store.py": "from edge.config import Settings\n",
        "api/app.py": "import edge.runtime\n",
    })
    assert cycles(package_graph(root)) == [["config", "runtime", "store"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_llama_cpp_and_fastapi_stay_in_their_rooms() -> None:
    assert confinement_violations() == []


def test_the_confinement_check_sees_local_imports_of_llama_cpp_and_starlette(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "runtime/llama/model.py": "import llama_cpp\n",
        "runtime/embed/embedder.py": "from edge.runtime.llama import llama_cpp\n",  # the allowed way
        "runtime/spec/config.py": "def f():\n    from llama_cpp.llama_grammar import JSON_GBNF\n",
        "tools/bare_loop.py": "import llama_cpp\n",
        "api/app.py": "from fastapi import FastAPI\nfrom starlette.responses import Response\n",
        "service/server.py": "import uvicorn\ndef f():\n    from starlette.requests import Request\n",
    })
    assert confinement_violations(root) == ["runtime/spec/config.py imports llama_cpp",
                                            "service/server.py imports starlette"]
