"""Code shape: no module of edge over 400 lines, no function over 60.

A long module mixes concerns and a long function hides its steps; both are where reviews
miss things. Read with `ast`, so methods, async functions and nested functions count, each
on its own (a nested function's lines count toward its parent too). The checker is tested
on a synthetic file so that it is known to fail when it should.
"""

from __future__ import annotations

import ast
from pathlib import Path

EDGE = Path(__file__).resolve().parents[2] / "edge"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_lines(text: str) -> int:
    """Lines as `wc -l` counts them (a last line without a newline is not counted)."""
    return text.count("\n")


def long_functions(text: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method longer than `limit` lines,
    decorators excluded, docstring and body included."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            if length > limit:
                out.append((node.name, node.lineno, length))
    return sorted(out, key=lambda t: t[1])


def offenders(root: Path = EDGE) -> list[str]:
    """One line per module over MAX_MODULE_LINES and per function over MAX_FUNCTION_LINES."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        if (n := module_lines(text)) > MAX_MODULE_LINES:
            bad.append(f"{rel}: module has {n} lines (max {MAX_MODULE_LINES})")
        bad.extend(f"{rel}:{line}: {name}() has {length} lines (max {MAX_FUNCTION_LINES})"
                   for name, line, length in long_functions(text))
    return bad


def test_edge_modules_and_functions_are_short() -> None:
    bad = offenders()
    assert not bad, "split these by concern:\n" + "\n".join(bad)


def _function(name: str, n_lines: int, indent: str = "", prefix: str = "def") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(n_lines - 1))
    return f"{indent}{prefix} {name}() -> None:\n{body}"


def test_the_checker_flags_a_61_line_function_and_passes_60() -> None:
    text = _function("long_one", 61) + "\n\n" + _function("just_fits", 60)
    assert long_functions(text) == [("long_one", 1, 61)]


def test_the_checker_sees_methods_async_and_nested_functions() -> None:
    method = "class C:\n" + _function("method", 61, indent="    ")
    assert [name for name, _, _ in long_functions(method)] == ["method"]
    assert [name for name, _, _ in long_functions(_function("coro", 61, prefix="async def"))] == ["coro"]
    nested = "def outer() -> None:\n" + _function("inner", 61, indent="    ")
    assert [name for name, _, _ in long_functions(nested)] == ["outer", "inner"]


def test_the_checker_reports_long_modules_and_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "edge"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "ok.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (pkg / "sub" / "big.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (pkg / "sub" / "fn.py").write_text("\n" + _function("long_one", 61))
    assert offenders(pkg) == [
        f"edge/sub/big.py: module has {MAX_MODULE_LINES + 1} lines (max {MAX_MODULE_LINES})",
        f"edge/sub/fn.py:2: long_one() has 61 lines (max {MAX_FUNCTION_LINES})",
    ]
