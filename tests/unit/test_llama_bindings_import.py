"""edge loads llama_cpp's ctypes bindings without the package's high-level half
(edge/runtime/llama/__init__.py), and the package still works for code that wants all of it."""

from __future__ import annotations

import subprocess
import sys

_HEAVY = ("llama_cpp.llama", "llama_cpp.llama_chat_format", "diskcache", "jinja2", "numpy")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_bindings_load_without_the_high_level_package() -> None:
    out = _run("import sys; from edge.runtime.llama import llama_cpp; "
               f"print(llama_cpp.__name__, sorted(m for m in {_HEAVY!r} if m in sys.modules))")
    assert out == "llama_cpp.llama_cpp []"


def test_the_full_package_completes_on_first_use() -> None:
    out = _run("from edge.runtime.llama import llama_cpp as low; import llama_cpp; "
               "from llama_cpp import Llama; "
               "print(Llama.__module__, llama_cpp.__version__, "
               "llama_cpp.llama_batch_init is low.llama_batch_init)")
    module, version, same = out.split()
    assert module == "llama_cpp.llama"
    assert version.count(".") == 2
    assert same == "True"


def test_a_missing_name_is_an_attribute_error_after_completion() -> None:
    out = _run("from edge.runtime.llama import llama_cpp\nimport llama_cpp as pkg\n"
               "try:\n    pkg.no_such_name\nexcept AttributeError as e:\n    print('AttributeError', e)\n"
               "print(hasattr(pkg, 'Llama'))")
    assert out.splitlines() == ["AttributeError module 'llama_cpp' has no attribute 'no_such_name'",
                                "True"]


def test_the_build_names_the_bindings_version() -> None:
    from importlib import metadata

    from edge.runtime.llama.build import build_info

    assert build_info().llama_cpp_python == metadata.version("llama_cpp_python")


def test_a_submodule_import_does_not_complete_the_package() -> None:
    out = _run("import sys; from edge.runtime.llama import llama_cpp; from llama_cpp import _ggml; "
               "from llama_cpp.llama_grammar import JSON_GBNF; "
               f"print(_ggml.__name__, sorted(m for m in {_HEAVY!r} if m in sys.modules))")
    assert out == "llama_cpp._ggml []"


def test_a_start_imports_no_numpy() -> None:
    """numpy (50-70 ms) comes with the first greedy sample, embedding or draft, not with a start."""
    out = _run("import sys, edge.commands.serve, edge.api.app, edge.runtime.engine.core, "
               "edge.runtime.embed.embedder, edge.runtime.spec.draft_model; print('numpy' in sys.modules)")
    assert out == "False"
