"""ggml's extra CPU buffer types: on for ARM's repacked kernels, off on x86 (AMX crashes;
without AMX the repack gained nothing and kept evicted models from their page-cache reload)."""

from __future__ import annotations

from edge.runtime.llama.backend import EXTRA_BUFFERS_ENV, extra_buffers_default

AVX2 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
ARM = "CPU : NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | DOTPROD = 1 | MATMUL_INT8 = 1 | REPACK = 1 |"
AMX = "CPU : AVX2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | REPACK = 1 |"


def test_on_for_arm_off_on_x86() -> None:
    assert extra_buffers_default(ARM, env={}) is True  # repacked Q4_0 kernels stay available
    assert extra_buffers_default(AVX2, env={}) is False  # mapped weights: an eviction keeps pages
    assert extra_buffers_default(AMX, env={}) is False
    assert extra_buffers_default("", env={}) is False


def test_environment_overrides_either_way() -> None:
    assert extra_buffers_default(AMX, env={EXTRA_BUFFERS_ENV: "1"}) is True
    assert extra_buffers_default(ARM, env={EXTRA_BUFFERS_ENV: "0"}) is False
    assert extra_buffers_default(AMX, env={EXTRA_BUFFERS_ENV: "yes"}) is False  # not 0/1: auto
