"""`edge quantize SRC DST --type Q8_0`: llama.cpp's quantizer in-process (no llama.cpp tools needed).

`--dequantize` writes an F16 copy instead (gguf-py): no precision comes back, but several
quantizations made from it can be compared with `edge eval A --against B` when only a
quantized file is at hand. Exit status: 0 written; 2 bad input (unknown type, invalid or
missing source, DST exists without --force); 1 llama.cpp refused (e.g. a quantized source
without --allow-requantize).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from edge.commands._common import add_settings_args
from edge.commands.exits import EXIT_USAGE
from edge.errors import InvalidGGUF, InvalidRequest, ModelNotFound


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quantize", help="write a model at another precision (llama.cpp's quantizer)")
    p.add_argument("src", help="store name or .gguf path")
    p.add_argument("dst", type=Path, help="output .gguf path")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--type", dest="ftype", metavar="TYPE", help="Q8_0, Q4_0, Q4_K_M, F16, ...")
    how.add_argument("--dequantize", action="store_true",
                     help="write every quantized tensor as F16 (a common source for comparing quantizations)")
    p.add_argument("--allow-requantize", action="store_true",
                   help="quantize a source that is already quantized (its error adds to the new one)")
    p.add_argument("--threads", type=int, default=0, help="quantizer threads (default: llama.cpp picks)")
    p.add_argument("--force", action="store_true", help="overwrite DST")
    add_settings_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edge.commands.inspect import resolve_model_path
    from edge.tools.quantize import dequantize_to_f16, quantize

    try:
        src = Path(resolve_model_path(args.src, args)).resolve()
        dst = Path(args.dst).expanduser()
        if dst.exists() and (dst.resolve() == src or not args.force):
            raise InvalidRequest(f"{dst} exists; pass --force to overwrite it (never the source)", "dst")
        if args.dequantize:
            dequantize_to_f16(src, dst)
        else:
            quantize(src, dst, args.ftype, n_threads=args.threads, allow_requantize=args.allow_requantize)
    except (InvalidRequest, InvalidGGUF, ModelNotFound) as exc:
        print(f"edge quantize: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {dst} ({dst.stat().st_size / 2**20:.1f} MiB)")
    return 0
