"""Which model loads may keep llama.cpp's log out of Python (runtime/llama/loadlog.py): only those
whose weights' buffers the settings alone decide."""

from __future__ import annotations

import pytest

from edge.runtime.llama.loadlog import MAPPED, known_buffers


@pytest.mark.parametrize(
    ("gpu_build", "extra", "mapped_mode", "vocab_only", "want"),
    [
        (False, False, True, False, MAPPED),  # CPU build, weights mapped: the log would say CPU_Mapped
        (True, False, True, False, None),  # a GPU device may take layers, or turn AUTO's mmap off
        (False, True, True, False, None),  # repacked copies: the log says which
        (False, False, False, False, None),  # read into memory: "CPU" buffers, by the log
        (True, True, False, True, ()),  # the vocabulary alone: no weights at all
    ],
)
def test_known_buffers(gpu_build: bool, extra: bool, mapped_mode: bool, vocab_only: bool,
                       want: tuple[str, ...] | None) -> None:
    assert known_buffers(gpu_build, extra, mapped_mode, vocab_only) == want
