"""Write tiny GGUF files for tests: valid models (gguf.GGUFWriter) and raw byte-level files.

`write_tiny_model` builds a llama-shaped model of any layer count, with GQA,
per-layer KV heads, sliding-window attention and a chat template as options; it
has no real weights (zeros), which is enough for validation and planning.
`RawGGUF` writes the format by hand so tests can craft malformed files that
GGUFWriter refuses to produce.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

# GGUF value type ids.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FMT = {
    UINT8: "B",
    INT8: "b",
    UINT16: "H",
    INT16: "h",
    UINT32: "I",
    INT32: "i",
    FLOAT32: "f",
    BOOL: "?",
    UINT64: "Q",
    INT64: "q",
    FLOAT64: "d",
}


def write_tiny_model(
    path: Path,
    *,
    arch: str = "llama",
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int | list[int] = 2,
    n_ff: int = 128,
    n_ctx_train: int = 1024,
    n_vocab: int = 64,
    head_dim: int | None = None,
    sliding_window: int | None = None,
    swa_pattern: int | list[bool] | None = None,
    chat_template: str | None = None,
    weight_type: GGMLQuantizationType = GGMLQuantizationType.F16,
    file_type: int = 1,
    license: str | None = "apache-2.0",
) -> Path:
    """A structurally complete model file; tensor shapes follow the given hyper-parameters."""
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(n_layer)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_file_type(file_type)
    if license:
        w.add_license(license)
    hd = head_dim or n_embd // n_head
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if sliding_window is not None:
        w.add_sliding_window(sliding_window)
    if swa_pattern is not None:
        key = f"{arch}.attention.sliding_window_pattern"
        if isinstance(swa_pattern, int):
            w.add_uint32(key, swa_pattern)
        else:
            w.add_array(key, list(swa_pattern))
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(n_vocab)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def add(name: str, shape: tuple[int, ...], qtype: GGMLQuantizationType) -> None:
        arr = np.zeros(shape, dtype=np.float32)
        if qtype == GGMLQuantizationType.F32:
            w.add_tensor(name, arr)
        elif qtype == GGMLQuantizationType.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)

    kv_heads = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv] * n_layer
    add("token_embd.weight", (n_vocab, n_embd), weight_type)
    for il in range(n_layer):
        add(f"blk.{il}.attn_norm.weight", (n_embd,), GGMLQuantizationType.F32)
        add(f"blk.{il}.attn_q.weight", (n_head * hd, n_embd), weight_type)
        add(f"blk.{il}.attn_k.weight", (kv_heads[il] * hd, n_embd), weight_type)
        add(f"blk.{il}.attn_v.weight", (kv_heads[il] * hd, n_embd), weight_type)
        add(f"blk.{il}.attn_output.weight", (n_embd, n_head * hd), weight_type)
        add(f"blk.{il}.ffn_norm.weight", (n_embd,), GGMLQuantizationType.F32)
        add(f"blk.{il}.ffn_gate.weight", (n_ff, n_embd), weight_type)
        add(f"blk.{il}.ffn_up.weight", (n_ff, n_embd), weight_type)
        add(f"blk.{il}.ffn_down.weight", (n_embd, n_ff), weight_type)
    add("output_norm.weight", (n_embd,), GGMLQuantizationType.F32)
    add("output.weight", (n_vocab, n_embd), weight_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_string(s: str | bytes, length: int | None = None) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def gguf_value(vtype: int, value: Any) -> bytes:
    """Encode a value of `vtype` (arrays: value = (elem_type, list))."""
    if vtype == STRING:
        return gguf_string(value)
    if vtype == ARRAY:
        etype, items = value
        body = b"".join(gguf_value(etype, v) for v in items)
        return struct.pack("<IQ", etype, len(items)) + body
    return struct.pack("<" + _FMT[vtype], value)


@dataclass
class RawTensorSpec:
    name: str
    shape: tuple[int, ...]
    ggml_type: int = int(GGMLQuantizationType.F32)
    offset: int | None = None  # None: packed after the previous tensor
    n_dims: int | None = None  # override the written n_dims


@dataclass
class RawGGUF:
    """A byte-level GGUF writer that will write whatever it is told, valid or not."""

    kvs: list[tuple[str, int, Any]] = field(default_factory=list)  # (key, type, value)
    tensors: list[RawTensorSpec] = field(default_factory=list)
    magic: bytes = b"GGUF"
    version: int = 3
    alignment: int = 32
    n_tensors_override: int | None = None
    n_kv_override: int | None = None
    raw_kv_bytes: bytes = b""  # appended verbatim after the encoded kvs (counted by n_kv_override)
    trailing_bytes: int = 0  # extra zero bytes after the tensor data

    @classmethod
    def minimal(cls, n_tensors: int = 2) -> RawGGUF:
        """A valid file: llama metadata and `n_tensors` small F32 tensors."""
        kvs: list[tuple[str, int, Any]] = [
            ("general.architecture", STRING, "llama"),
            ("llama.block_count", UINT32, 1),
            ("llama.context_length", UINT32, 256),
            ("llama.embedding_length", UINT32, 32),
            ("llama.attention.head_count", UINT32, 4),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "c"])),
        ]
        tensors = [RawTensorSpec(f"blk.0.t{i}", (32, 2)) for i in range(n_tensors)]
        return cls(kvs=kvs, tensors=tensors)

    def header_bytes(self) -> bytes:
        out = bytearray(self.magic + struct.pack("<I", self.version))
        out += struct.pack(
            "<Q", len(self.tensors) if self.n_tensors_override is None else self.n_tensors_override
        )
        out += struct.pack("<Q", len(self.kvs) if self.n_kv_override is None else self.n_kv_override)
        for key, vtype, value in self.kvs:
            out += gguf_string(key) + struct.pack("<I", vtype) + gguf_value(vtype, value)
        out += self.raw_kv_bytes
        offset = 0
        for t in self.tensors:
            out += gguf_string(t.name)
            out += struct.pack("<I", len(t.shape) if t.n_dims is None else t.n_dims)
            out += b"".join(struct.pack("<Q", d) for d in t.shape)
            out += struct.pack("<I", t.ggml_type)
            out += struct.pack("<Q", offset if t.offset is None else t.offset)
            offset += _padded(_nbytes(t), self.alignment)
        return bytes(out)

    def to_bytes(self) -> bytes:
        head = self.header_bytes()
        data_start = _padded(len(head), self.alignment)
        data = bytearray()
        for t in self.tensors:
            n = _padded(_nbytes(t), self.alignment)
            data += bytes(range(256)) * (n // 256) + bytes(n % 256)
        return head + bytes(data_start - len(head)) + bytes(data) + bytes(self.trailing_bytes)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.to_bytes())
        return path


def _nbytes(t: RawTensorSpec) -> int:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
    except ValueError:
        block, size = 1, 4
    n = 1
    for d in t.shape:
        n *= d
    return min(n // block * size, 1 << 20)


def _padded(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment
