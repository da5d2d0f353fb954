"""llama.cpp's log: routed to the `edge.llama` logger, captured while a model loads, or, for a
load whose outcome the log would not change, not delivered to Python at all.

Every line llama.cpp logs (about 2,300 for a 135M model's load, most of them DEBUG) is a call
into Python that must take the GIL. At start the model loads on its own thread while the main
thread imports the HTTP stack and holds the GIL for up to a switch interval at a time, so each
line waits: measured on a 2-core VM (SmolLM2 135M, FastAPI imported meanwhile), the load took
0.34-0.43 s with the Python callback and 0.12-0.16 s with a C function that does nothing. Creating the
context logs as many lines again (graph reservation); edge reads none of them, so that is quiet
too (`quiet_log`).

A load may go quiet only where what edge reads from its log is known without it: the weights'
buffers ("load_tensors: CPU_Mapped model buffer size = ..."), which tell the model host whether an
unload can give the weights' pages back and map them again (kv/residency.py). That is a CPU-only
build (no GPU device whose lack of mmap support turns llama.cpp's AUTO load mode off), no ggml
extra buffer types (repacked copies), a mapped or AUTO load mode, and all the weights: then every
weight is in "CPU_Mapped". With `-v` (the edge.llama logger at DEBUG) loads are never quiet, so
the whole log is there when someone asks for it; a quiet load that fails says to run with `-v`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

from edge.runtime.llama import llama_cpp

log = logging.getLogger("edge.llama")

BUFFER_LINE = re.compile(r"load_tensors:\s+(\S+) model buffer size\s*=")
MAPPED = ("CPU_Mapped",)  # every weight computed straight from the file mapping

# ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5 (continues the previous line)
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class Backend:
    """llama.cpp's process-wide state: backend init and log routing, done once."""

    lock = threading.Lock()
    ready = False
    warned_extra = False
    last_level = logging.DEBUG
    quiet_calls = 0  # calls running with the C no-op callback (the callback is process-wide)
    captured: ClassVar[dict[int, list[str]]] = {}  # thread id -> llama.cpp's lines while it loads a model

    @staticmethod
    @llama_cpp.llama_log_callback
    def on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        lines = Backend.captured.get(threading.get_ident())
        if lines is not None:
            lines.append(text.decode("utf-8", "replace"))
        py_level = Backend.last_level if level == 5 else _LEVELS.get(level, logging.DEBUG)
        Backend.last_level = py_level
        # llama.cpp is chatty at INFO; only its warnings and errors reach our INFO level
        if py_level <= logging.INFO:
            py_level = logging.DEBUG
        if log.isEnabledFor(py_level):
            log.log(py_level, "%s", text.decode("utf-8", "replace").rstrip("\n"))


def ensure_backend() -> None:
    with Backend.lock:
        if not Backend.ready:
            llama_cpp.llama_log_set(Backend.on_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            Backend.ready = True


def _no_op() -> Any:
    """A C function that ignores its arguments: libc's getpid. Called as
    `(int level, const char *text, void *user)`, which the C calling conventions edge runs on
    (x86-64 System V, AArch64) allow: the arguments are in registers the callee never reads."""
    return ctypes.cast(ctypes.CDLL(None).getpid, llama_cpp.llama_log_callback)


_NO_OP: list[Any] = []  # made once; C keeps the pointer while quiet


def known_buffers(gpu_build: bool, use_extra_bufts: bool, mapped_mode: bool,
                  vocab_only: bool) -> tuple[str, ...] | None:
    """The weights' buffers as the load log would name them, where the settings alone decide
    them (see the module docstring); None where only the log can tell."""
    if vocab_only:
        return ()
    if gpu_build or use_extra_bufts or not mapped_mode:
        return None
    return MAPPED


@contextlib.contextmanager
def quiet_log() -> Iterator[bool]:
    """llama.cpp's log stays in C while this runs (unless -v): for calls whose log edge reads
    nothing from. Yields whether it is quiet."""
    if log.isEnabledFor(logging.DEBUG):
        yield False
        return
    with Backend.lock:
        if not _NO_OP:
            _NO_OP.append(_no_op())
        Backend.quiet_calls += 1
        llama_cpp.llama_log_set(_NO_OP[0], ctypes.c_void_p(0))
    try:
        yield True
    finally:
        with Backend.lock:
            Backend.quiet_calls -= 1
            if Backend.quiet_calls == 0:
                llama_cpp.llama_log_set(Backend.on_log, ctypes.c_void_p(0))


@contextlib.contextmanager
def load_log(quiet: bool) -> Iterator[list[str] | None]:
    """Around one model load on this thread: yields the list its log lines go to, or None when
    the load is quiet (`quiet_log`). A loud load while another thread's quiet call runs hears
    nothing: an empty account, which never claims mapped weights that are not."""
    if quiet:
        with quiet_log() as on:
            if on:
                yield None
                return
    lines: list[str] = []
    Backend.captured[threading.get_ident()] = lines
    try:
        yield lines
    finally:
        del Backend.captured[threading.get_ident()]
