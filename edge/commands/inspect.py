"""`edge inspect MODEL [--json] [--tensors]`: what a GGUF file holds, checked before any load."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edge.commands._common import add_settings_args, settings_from_args
from edge.gguf import GGUFInfo, info_to_json, validate_gguf


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="validate a GGUF model and show its facts")
    p.add_argument("model", help="path to a .gguf file or a pulled model name")
    p.add_argument("--json", action="store_true", help="print stable JSON keys")
    p.add_argument("--tensors", action="store_true", help="also list every tensor")
    add_settings_args(p)
    p.set_defaults(func=run)


def resolve_model_path(ref: str, args: argparse.Namespace) -> Path:
    """An existing path is used as is (a directory fails validation); anything else is a store name."""
    candidate = Path(ref).expanduser()
    if candidate.exists():
        return candidate
    from edge.store import resolve_model

    return resolve_model(ref, settings_from_args(args))


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def render(info: GGUFInfo, *, tensors: bool = False) -> str:
    """Human-readable summary, one fact per line."""
    heads_kv = (
        f"{min(info.n_head_kv)}-{max(info.n_head_kv)} (per layer)"
        if isinstance(info.n_head_kv, tuple)
        else str(info.n_head_kv)
    )
    swa = (
        f"{info.sliding_window} tokens on {info.n_swa_layers} of {info.n_layer} layers"
        if info.sliding_window
        else "none"
    )
    mix = ", ".join(f"{name} x{count}" for name, count in info.quant_mix.items())
    rows = [
        ("file", f"{info.path} ({_mib(info.file_size_bytes)}, GGUF v{info.version})"),
        ("name", info.name or "-"),
        ("architecture", info.architecture),
        ("parameters", f"{info.n_params / 1e6:.1f} M"),
        ("file type", info.file_type or "-"),
        ("quantization", mix),
        ("layers", str(info.n_layer)),
        ("heads", str(info.n_head)),
        ("kv heads", heads_kv),
        ("embedding", str(info.n_embd)),
        ("head dim", f"{info.head_dim_k} (k), {info.head_dim_v} (v)"),
        ("train context", str(info.n_ctx_train)),
        ("sliding window", swa),
        (
            "kv per token",
            f"{info.kv_bytes_per_token('f16')} B (f16), {info.kv_bytes_per_token('q8_0')} B (q8_0)",
        ),
        ("chat template", "yes" if info.chat_template else "no"),
        ("licence", info.license or "-"),
        ("tokenizer", f"{info.tokenizer_model or '-'} ({info.n_vocab} tokens)"),
    ]
    out = [f"{k:15} {v}" for k, v in rows]
    if tensors:
        out.append("")
        for t in info.tensors:
            out.append(f"{t.name:40} {t.ggml_type:8} {'x'.join(map(str, t.shape)):>16} {t.n_bytes:>12}")
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    info = validate_gguf(resolve_model_path(args.model, args))
    if args.json:
        data = info_to_json(info)
        if args.tensors:
            data["tensors"] = [
                {"name": t.name, "type": t.ggml_type, "shape": list(t.shape), "n_bytes": t.n_bytes}
                for t in info.tensors
            ]
        print(json.dumps(data, indent=2))
    else:
        print(render(info, tensors=args.tensors))
    return 0
