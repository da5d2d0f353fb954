"""`edge inspect MODEL [--json] [--tensors]`: what a GGUF file holds, checked before any load.

Also which chat template `serve` would render chats with: the model's own, the plain
fallback (base models), or the one `--chat-template` / the `chat_template` setting names,
with its tool-call syntax and the turn markers that stop generation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from edge.commands._common import add_settings_args, settings_from_args
from edge.gguf import GGUFInfo, info_to_json, validate_gguf


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="validate a GGUF model and show its facts")
    p.add_argument("model", help="path to a .gguf file or a pulled model name")
    p.add_argument("--json", action="store_true", help="print stable JSON keys")
    p.add_argument("--tensors", action="store_true", help="also list every tensor")
    p.add_argument("--chat-template", default=None, metavar="NAME|FILE",
                   help="report this template instead of the model's (as `serve --chat-template`)")
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


def template_in_use(model_template: str | None, setting: str | None) -> dict[str, Any]:
    """What `serve` would use: {source, name, tools, tool_format, stop} or {source, error} when the
    model's template does not compile (serve would then fail every chat with a 400)."""
    from edge.errors import TemplateError
    from edge.runtime.text.chat_template import describe, load_template, resolve_chat_template

    choice = resolve_chat_template(setting)
    try:
        template = load_template(choice.source if choice is not None else model_template)
    except TemplateError as exc:
        return {"source": "model", "name": None, "error": str(exc)}
    return describe(template, choice).as_json()


def _template_text(t: dict[str, Any]) -> str:
    if "error" in t:
        return f"model's own, unusable: {t['error']}"
    what = {"model": "model's own", "fallback": f"fallback {t['name']!r} (the model has none)",
            "name": f"built-in {t['name']!r}", "file": f"file {t['name']}"}.get(t["source"], t["source"])
    parts = [f"tools: {t['tool_format']}" if t["tools"] else "no tools"]
    if t["stop"]:
        parts.append("stops at " + ", ".join(json.dumps(s) for s in t["stop"]))
    return f"{what} ({'; '.join(parts)})"


def render(info: GGUFInfo, *, tensors: bool = False, template: dict[str, Any] | None = None) -> str:
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
        *([("template in use", _template_text(template))] if template is not None else []),
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
    setting = args.chat_template
    if setting is None:
        setting = settings_from_args(args).chat_template
    template = template_in_use(info.chat_template, setting)
    if args.json:
        data = info_to_json(info)
        data["chat_template_in_use"] = template
        if args.tensors:
            data["tensors"] = [
                {"name": t.name, "type": t.ggml_type, "shape": list(t.shape), "n_bytes": t.n_bytes}
                for t in info.tensors
            ]
        print(json.dumps(data, indent=2))
    else:
        print(render(info, tensors=args.tensors, template=template))
    return 0
