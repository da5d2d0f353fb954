"""The packages import in the direction the data flows, never back up.

Every `import edge.X` / `from edge.X import` in the package is read with `ast`, lazy
imports inside functions and TYPE_CHECKING blocks included, so a dependency that
only shows up at run time on some platform is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

EDGE = Path(__file__).resolve().parents[2] / "edge"

# package -> edge packages it must never import
FORBIDDEN: dict[str, set[str]] = {
    "platforms": {"*"},  # platform detection stands alone
    "telemetry": {"runtime", "api", "sim", "scheduler", "service", "commands", "probe"},
    "probe": {"runtime", "api", "sim", "scheduler", "service", "commands"},
    "runtime": {"api", "scheduler", "service", "sim", "commands", "bench"},
    "scheduler": {"api", "service", "sim", "commands", "bench"},
    "api": {"service", "sim", "commands", "bench"},
    "gguf": {"runtime", "api", "scheduler", "service", "sim", "telemetry", "commands"},
    "planner": {"runtime", "api", "scheduler", "service", "sim", "telemetry", "commands"},
}


def _package(path: Path) -> str:
    rel = path.relative_to(EDGE)
    return rel.parts[0].removesuffix(".py")


def edge_imports(path: Path) -> set[str]:
    """Top-level edge packages a module imports (relative imports stay inside the package)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        out.update(n.split(".")[1] for n in names if n.startswith("edge."))
    return out


def _violations() -> list[str]:
    bad = []
    for path in sorted(EDGE.rglob("*.py")):
        pkg = _package(path)
        rule = FORBIDDEN.get(pkg)
        if rule is None:
            continue
        for target in edge_imports(path) - {pkg}:
            if "*" in rule or target in rule:
                bad.append(f"{path.relative_to(EDGE.parent)} imports edge.{target}")
    return bad


def test_no_package_imports_one_above_it() -> None:
    assert _violations() == []


def test_the_check_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edge.api import app\n"
                   "def f():\n    import edge.sim.device\n    from . import sibling\n")
    assert edge_imports(mod) == {"api", "sim"}


@pytest.mark.parametrize("pkg", sorted(FORBIDDEN))
def test_every_ruled_package_exists(pkg: str) -> None:
    assert (EDGE / pkg).is_dir() or (EDGE / f"{pkg}.py").is_file()
