"""Quiet loads on the real SmolLM2 (runtime/llama/loadlog.py): llama.cpp's load and context log
stays out of Python, what edge reads from that log is the same as llama.cpp's own account, and
the Python route is back afterwards."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from edge.runtime.llama.backend import probe_backends
from edge.runtime.llama.loadlog import MAPPED, Backend, quiet_log
from edge.runtime.llama.model import ContextConfig, LlamaContext, LlamaModel

pytestmark = pytest.mark.model


def _lines_while(fn: object) -> list[str]:
    """What llama.cpp's Python log callback received on this thread while `fn` ran."""
    lines: list[str] = []
    Backend.captured[threading.get_ident()] = lines
    try:
        fn()  # type: ignore[operator]
    finally:
        del Backend.captured[threading.get_ident()]
    return lines


def test_a_quiet_load_reaches_python_with_no_line_and_knows_what_the_log_says(
        smollm2_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if probe_backends().gpu_offload:
        pytest.skip("a GPU build keeps the load's log: only it can tell where the weights went")
    caplog.set_level(logging.INFO, logger="edge.llama")
    held: list[LlamaModel] = []
    quiet = _lines_while(lambda: held.append(LlamaModel(smollm2_path)))
    assert quiet == []  # not one of the ~1,200 lines took the GIL
    ctx: list[LlamaContext] = []
    ctx_lines = _lines_while(lambda: ctx.append(
        LlamaContext(held[0], ContextConfig(n_ctx=256, n_seq_max=1, n_threads=1))))
    assert ctx_lines == []  # nor one of the context's ~1,000
    ctx[0].close()
    assert Backend.quiet_calls == 0
    # the Python route is back after both: this load's buffers come from the lines it heard
    told = LlamaModel(smollm2_path, quiet=False)
    try:
        assert told.weight_buffers == MAPPED  # llama.cpp's own account
        assert held[0].weight_buffers == told.weight_buffers
        assert held[0].weights_mapped
    finally:
        told.close()
        held[0].close()


def test_verbose_keeps_every_line(smollm2_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="edge.llama")
    with quiet_log() as quiet:
        assert not quiet
    model = LlamaModel(smollm2_path)
    try:
        assert "model buffer size" in caplog.text
        assert model.weights_mapped
    finally:
        model.close()
