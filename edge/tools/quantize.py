"""A GGUF at another precision: llama.cpp's own quantizer, and an F16 copy written with gguf-py.

`quantize()` is what `llama-quantize` does, called in-process through llama-cpp-python
(llama_model_quantize), so an installed edge can make a Q8_0 or Q4_0 file without the
llama.cpp tools. `dequantize_to_f16()` turns a quantized file back into F16: no precision
comes back, but it gives one common source from which several quantizations can be made
and compared (`edge eval A --against B`) when only a quantized file is at hand.

Both write to `<dst>.partial` and rename, so an interrupted run never leaves a file that
looks complete.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from edge.errors import InvalidRequest, ModelLoadError
from edge.runtime.llama import llama_cpp
from edge.runtime.llama.loadlog import ensure_backend

_PREFIX = "LLAMA_FTYPE_MOSTLY_"
# llama_ftype by its usual name (Q8_0, Q4_0, Q4_K_M, F16, ...), from the installed binding
FTYPES: dict[str, int] = {
    "F32": int(llama_cpp.LLAMA_FTYPE_ALL_F32),
    **{n[len(_PREFIX):]: int(getattr(llama_cpp, n)) for n in dir(llama_cpp) if n.startswith(_PREFIX)},
}
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
GGUF_FILE_TYPE_F16 = 1  # general.file_type of a mostly-F16 file (llama_ftype LLAMA_FTYPE_MOSTLY_F16)


def ftype_of(name: str) -> int:
    """The llama_ftype for a name such as 'Q8_0' (case-insensitive)."""
    value = FTYPES.get(name.upper())
    if value is None:
        known = ", ".join(sorted(FTYPES))
        raise InvalidRequest(f"unknown quantization type {name!r}; use one of {known}", "type")
    return value


def _partial(dst: Path) -> Path:
    return dst.with_name(dst.name + ".partial")


def quantize(src: str | Path, dst: str | Path, ftype_name: str, *, n_threads: int = 0,
             allow_requantize: bool = False) -> Path:
    """Write `src` quantized to `ftype_name` at `dst` with llama.cpp's quantizer (its default mix:
    e.g. norms stay F32, and the output tensor may get a higher type). `n_threads` 0: llama.cpp
    picks. A source that is already quantized needs `allow_requantize` (quality suffers twice).
    Raises InvalidGGUF (src fails edge's validation), InvalidRequest (unknown type),
    ModelLoadError (llama.cpp refused)."""
    from edge.gguf import validate_gguf

    src, dst = Path(src), Path(dst)
    ftype = ftype_of(ftype_name)
    info = validate_gguf(src)  # llama.cpp opens only files edge has validated
    quantized = any(t not in _FLOAT_TYPES for t in info.quant_mix)
    ensure_backend()  # routes llama.cpp's log to the edge.llama logger
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads
    params.allow_requantize = allow_requantize
    tmp = _partial(dst)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        requant = quantized and not allow_requantize
        hint = "; the source is already quantized: allow requantizing (--allow-requantize)" if requant else ""
        raise ModelLoadError(str(src), f"llama.cpp could not quantize it to {ftype_name.upper()} "
                                       f"(status {rc}{hint}; run with -v for its log)")
    os.replace(tmp, dst)
    return dst


def dequantize_to_f16(src: str | Path, dst: str | Path) -> Path:
    """Write `src` with every quantized or BF16 tensor as F16 (F32 and F16 tensors as they are),
    every metadata key copied, and general.file_type set to F16 (gguf.GGUFReader ->
    gguf.quants.dequantize -> gguf.GGUFWriter, as gguf-py's own gguf_new_metadata copies)."""
    import gguf
    from gguf import GGMLQuantizationType as T

    from edge.gguf import validate_gguf

    src, dst = Path(src), Path(dst)
    validate_gguf(src)
    reader = gguf.GGUFReader(src)
    arch_field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise InvalidRequest(f"{src} has no {gguf.Keys.General.ARCHITECTURE}", "model")
    tmp = _partial(dst)
    writer = gguf.GGUFWriter(tmp, arch=str(arch_field.contents()), endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    try:
        for field in reader.fields.values():
            # GGUF.* are the reader's virtual fields; the writer adds the architecture itself
            if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
                continue
            vtype = field.types[0]
            if field.name == gguf.Keys.General.FILE_TYPE:
                writer.add_key_value(field.name, GGUF_FILE_TYPE_F16, vtype)
                continue
            sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)
        if reader.get_field(gguf.Keys.General.FILE_TYPE) is None:
            writer.add_file_type(GGUF_FILE_TYPE_F16)
        for t in reader.tensors:
            if t.tensor_type in (T.F32, T.F16):
                data = np.asarray(t.data)
            else:  # quantized blocks (or BF16) -> float32 rows -> F16
                data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float16)
            writer.add_tensor(t.name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    writer.close()
    os.replace(tmp, dst)
    return dst
