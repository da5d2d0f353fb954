"""The planner against what llama.cpp really allocates, for both real models.

Each case runs in a fresh interpreter (so earlier loads do not pollute RSS), builds
the context the engine builds (unified KV cache, or a stream per slot for a sliding-window
model, n_seq_max = slots, swa_full off,
flash attention auto, n_outputs_max = slots), captures llama.cpp's log lines through
`llama_log_set`, and prefills one full micro-batch so that the compute buffer and
every weight page are resident (with mmap'd weights RSS counts a page only once
touched; after a full forward pass all of them are, so the default load mode and a
plain read give the same steady state).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from edge.gguf import validate_gguf
from edge.planner import MIB, plan_memory

pytestmark = pytest.mark.model

N_SLOTS = 4
N_UBATCH = 512

PROBE = r"""
import ctypes, json, re, sys
import psutil
proc = psutil.Process()
cfg = json.loads(sys.argv[1])
out = {"rss_start": proc.memory_info().rss}
import llama_cpp as L
logs = []
@L.llama_log_callback
def _log(level, text, user_data):
    logs.append(text.decode("utf-8", "replace"))
L.llama_log_set(_log, ctypes.c_void_p(0))
L.llama_backend_init()
out["rss_after_import"] = proc.memory_info().rss
mp = L.llama_model_default_params()
mp.n_gpu_layers = 0
from edge.runtime.llama.backend import extra_buffers_default  # the weights' buffers as the engine places them
mp.use_extra_bufts = extra_buffers_default(L.llama_print_system_info().decode("utf-8", "replace"))
model = L.llama_model_load_from_file(cfg["path"].encode(), mp)
assert model, "model load failed"
cp = L.llama_context_default_params()
from edge.kvcache import per_sequence_streams  # the engine's layout: a stream per sequence for SWA models
unified = not per_sequence_streams(L.llama_model_n_swa(model))
cp.n_ctx, cp.n_seq_max, cp.kv_unified, cp.swa_full = cfg["n_ctx"], cfg["n_seq"], unified, False
cp.n_batch = cp.n_ubatch = cfg["n_ubatch"]
cp.n_outputs_max = cfg["n_seq"]
cp.type_k = cp.type_v = {"f16": 1, "q8_0": 8, "q4_0": 2}[cfg["kv"]]
cp.n_threads = cp.n_threads_batch = 2
ctx = L.llama_init_from_model(model, cp)
assert ctx, "context creation failed"
if cfg["decode"]:
    n = cfg["n_ubatch"]
    b = L.llama_batch_init(n, 0, 1)
    for i in range(n):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = (i * 7) % 200 + 10, i, 1, i == n - 1
        b.seq_id[i][0] = 0
    b.n_tokens = n
    assert L.llama_decode(ctx, b) == 0, "decode failed"
out["rss_end"] = proc.memory_info().rss
text = "".join(logs)
mib = lambda pat: [float(x) for x in re.findall(pat, text)]
out["kv_mib"] = mib(r"KV buffer size =\s*([\d.]+) MiB")
out["compute_mib"] = mib(r"compute buffer size =\s*([\d.]+) MiB")
out["output_mib"] = mib(r"output buffer size =\s*([\d.]+) MiB")
out["n_ctx"] = [int(x) for x in re.findall(r"llama_context: n_ctx\s+= (\d+)", text)]
print(json.dumps(out))
"""


def _probe(path: Path, n_ctx: int, kv: str, decode: bool) -> dict[str, Any]:
    cfg = {
        "path": str(path),
        "n_ctx": n_ctx,
        "n_seq": N_SLOTS,
        "kv": kv,
        "n_ubatch": N_UBATCH,
        "decode": decode,
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CASES = [
    (model, n_ctx, kv)
    for model in ("smollm2_path", "gemma_path")
    for n_ctx in (2048, 8192)
    for kv in ("f16", "q8_0")
]


@pytest.mark.parametrize(("model", "n_ctx", "kv"), CASES)
def test_plan_matches_llama_cpp(request: pytest.FixtureRequest, model: str, n_ctx: int, kv: str) -> None:
    path: Path = request.getfixturevalue(model)
    info = validate_gguf(path)
    plan = plan_memory(
        info,
        n_ctx=n_ctx,
        n_slots=N_SLOTS,
        kv_type=kv,
        gpu_layers=0,
        available_bytes=64 << 30,
        reserve_bytes=0,
        unified_memory=False,
        n_batch=N_UBATCH,
        n_ubatch=N_UBATCH,
        n_outputs_max=N_SLOTS,
    )
    decode = kv == "f16"  # the RSS check needs a forward pass; the KV check does not
    got = _probe(path, n_ctx, kv, decode)
    assert got["n_ctx"] == [plan.n_ctx]

    # (a) KV: the sum of the caches llama.cpp allocated (two for SWA models) within 2%
    kv_llama = sum(got["kv_mib"]) * MIB
    assert len(got["kv_mib"]) == (2 if info.n_swa_layers else 1)
    assert abs(plan.kv_bytes - kv_llama) <= 0.02 * kv_llama, (plan.kv_bytes / MIB, got["kv_mib"])

    # compute and output buffers as llama.cpp reports them
    compute_llama = got["compute_mib"][0] * MIB
    assert abs(plan.compute_bytes - compute_llama) <= 0.10 * compute_llama, (plan.compute_bytes / MIB, got)
    assert abs(plan.output_bytes - got["output_mib"][0] * MIB) <= 0.01 * plan.output_bytes

    # (b) total (minus the reserve) against what the process really gained, within 15%
    if decode:
        gained = got["rss_end"] - got["rss_start"]
        # the probe's interpreter was already running and imports no server modules
        predicted = plan.total_bytes - plan.reserve_bytes - plan.python_bytes
        print(
            f"{path.name} ctx={n_ctx} {kv}: plan {predicted / MIB:.1f} MiB, RSS gained {gained / MIB:.1f} MiB"
        )
        assert abs(predicted - gained) <= 0.15 * gained, (predicted / MIB, gained / MIB, got)


def test_real_models_validate_fast(smollm2_path: Path, gemma_path: Path) -> None:
    import time

    for path in (smollm2_path, gemma_path):
        t0 = time.perf_counter()
        info = validate_gguf(path)
        assert time.perf_counter() - t0 < 1.0
        assert info.weights_bytes < info.file_size_bytes
    gemma = validate_gguf(gemma_path)
    assert gemma.architecture == "gemma3" and gemma.sliding_window == 512 and gemma.n_swa_layers == 15
    assert gemma.chat_template is None
    smol = validate_gguf(smollm2_path)
    assert smol.architecture == "llama" and smol.n_layer == 30 and smol.n_head_kv == 3
    assert smol.chat_template is not None and smol.file_type == "MOSTLY_Q4_1"
