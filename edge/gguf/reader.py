"""Bounded GGUF parser: every length and count is checked against the bytes left.

Why our own parser: `gguf.GGUFReader` trusts lengths from the file (a hostile
string length or array count makes it allocate or spin), and it is slow on large
vocabularies (tens of seconds for a 262k-token vocabulary). This parser reads
only the header, the key/value section and the tensor infos through a read-only
mmap, never tensor data, and raises `InvalidGGUF` naming the first problem on one
line (names from the file are quoted through `shown`: escaped and cut short).
Found by fuzzing (tests/gguf_fuzz.py): a lying key length must not make us copy
the rest of the file, and a repeated vocabulary token, which llama.cpp's loader
GGML_ASSERTs on (killing the process), is refused here.

Layout (little-endian), per the GGUF spec and ggml/src/gguf.cpp:
  magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
  n_kv × (string key | u32 type | value)            value: scalar, string, or
                                                     u32 elem type | u64 n | n × elem
  n_tensors × (string name | u32 n_dims | n_dims × u64 ne | u32 ggml type | u64 offset)
  padding to `general.alignment` | tensor data (offsets relative to this point)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from edge.errors import InvalidGGUF
from edge.gguf.strings import skip_strings, walk_unique_strings

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_STRING_BYTES = 1 << 30  # llama.cpp's GGUF_MAX_STRING_LENGTH
MAX_ARRAY_ELEMENTS = 1 << 30  # llama.cpp's GGUF_MAX_ARRAY_ELEMENTS
MAX_TENSOR_NAME_BYTES = 63  # GGML_MAX_NAME (64) including the NUL; llama.cpp counts bytes
MAX_KEY_BYTES = 1 << 16  # real keys are tens of bytes; a lying length must not make us copy the file
UNIQUE_STRINGS_KEY = "tokenizer.ggml.tokens"  # llama.cpp aborts on a repeated token
SHOWN_CHARS_MAX = 80  # a name from the file is cut here in a reason
MAX_DIMS = 4  # GGML_MAX_DIMS
INT64_MAX = (1 << 63) - 1
KEEP_ARRAY_VALUES_MAX = 4096  # larger arrays (vocabularies) are skipped, only counted
KEEP_STRING_BYTES_MAX = 4 << 20  # longer strings are skipped (a hostile file must not make us allocate)

# GGUF value types (gguf.GGUFValueType) → (name, struct format, size in bytes).
T_STRING = 8
T_ARRAY = 9
_SCALARS: dict[int, tuple[str, str, int]] = {
    0: ("uint8", "<B", 1),
    1: ("int8", "<b", 1),
    2: ("uint16", "<H", 2),
    3: ("int16", "<h", 2),
    4: ("uint32", "<I", 4),
    5: ("int32", "<i", 4),
    6: ("float32", "<f", 4),
    7: ("bool", "<?", 1),
    10: ("uint64", "<Q", 8),
    11: ("int64", "<q", 8),
    12: ("float64", "<d", 8),
}
TYPE_NAMES: dict[int, str] = {**{k: v[0] for k, v in _SCALARS.items()}, T_STRING: "string", T_ARRAY: "array"}

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
# Smallest possible encodings, used to bound counts by the bytes left.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, 1-byte key, type, 1-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset


@dataclass(frozen=True)
class GGUFArray:
    """An array value; `values` is None when the array is too large to keep (vocabularies)."""

    elem_type: str
    count: int
    values: tuple[Any, ...] | None


@dataclass(frozen=True)
class SkippedString:
    """A string value too long to keep in memory; only its length is known."""

    n_bytes: int


@dataclass(frozen=True)
class RawTensor:
    """A tensor info record as written, before layout checks."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # relative to the data section
    info_pos: int  # file offset of the record, for error messages


@dataclass(frozen=True)
class RawGGUF:
    """Everything before the tensor data, parsed and bounds-checked."""

    version: int
    kv: dict[str, Any]
    kv_types: dict[str, str]
    tensors: tuple[RawTensor, ...]
    alignment: int
    data_offset: int
    file_size_bytes: int


def shown(name: str) -> str:
    """A key or tensor name from the file as a reason quotes it: unprintable characters escaped and
    cut at SHOWN_CHARS_MAX, so a reason stays one short line (a name may be any bytes, any size)."""
    cut = name[:SHOWN_CHARS_MAX]
    if not cut.isprintable():
        cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in cut)
    return cut + "…" if len(name) > SHOWN_CHARS_MAX else cut


class _Cursor:
    """Bounded little-endian reader over a buffer; raises InvalidGGUF instead of overrunning."""

    __slots__ = ("buf", "end", "path", "pos")

    def __init__(self, buf: Any, end: int, path: str) -> None:
        self.buf = buf
        self.pos = 0
        self.end = end
        self.path = path

    def fail(self, reason: str, offset: int | None = None) -> InvalidGGUF:
        return InvalidGGUF(self.path, reason, self.pos if offset is None else offset)

    def need(self, n_bytes: int, what: str) -> None:
        if n_bytes > self.end - self.pos:
            raise self.fail(
                f"file truncated: {what} needs {n_bytes} bytes but only {self.end - self.pos} remain"
            )

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def string_len(self, what: str) -> int:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > MAX_STRING_BYTES:
            raise self.fail(f"{what} has length {n}, above the {MAX_STRING_BYTES}-byte limit", start)
        if n > self.end - self.pos:
            raise self.fail(
                f"file truncated: {what} has length {n} but only {self.end - self.pos} bytes remain", start
            )
        return n

    def string(self, what: str, max_bytes: int = MAX_STRING_BYTES) -> str:
        """A key or name: at most `max_bytes`, checked before anything is copied."""
        start = self.pos
        n = self.string_len(what)
        if n > max_bytes:
            raise self.fail(f"{what} is {n} bytes, above the {max_bytes}-byte limit", start)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def string_value(self, what: str) -> str | SkippedString:
        """Like string(), but a value above KEEP_STRING_BYTES_MAX is walked, not copied."""
        n = self.string_len(what)
        if n > KEEP_STRING_BYTES_MAX:
            self.pos += n
            return SkippedString(n)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")


def _read_value(cur: _Cursor, vtype: int, key: str, *, unique: bool = False) -> Any:
    """The value of type `vtype` at the cursor; `key` is the key as reasons show it, `unique`
    asks an array of strings to hold no repeats."""
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        _, fmt, size = scalar
        cur.need(size, f"value of key '{key}'")
        (v,) = struct.unpack_from(fmt, cur.buf, cur.pos)
        cur.pos += size
        return v
    if vtype == T_STRING:
        return cur.string_value(f"string value of key '{key}'")
    if vtype == T_ARRAY:
        return _read_array(cur, key, unique=unique)
    raise cur.fail(f"key '{key}' has unknown value type {vtype}", cur.pos - 4)


def _read_array(cur: _Cursor, key: str, *, unique: bool = False) -> GGUFArray:
    """An array value; `unique`: its strings must differ (the vocabulary), checked on the raw bytes."""
    type_pos = cur.pos
    etype = cur.u32(f"array element type of key '{key}'")
    if etype == T_ARRAY:
        raise cur.fail(f"key '{key}' holds a nested array, which GGUF readers do not support", type_pos)
    if etype != T_STRING and etype not in _SCALARS:
        raise cur.fail(f"key '{key}' is an array of unknown value type {etype}", type_pos)
    count_pos = cur.pos
    count = cur.u64(f"array length of key '{key}'")
    if count > MAX_ARRAY_ELEMENTS:
        raise cur.fail(f"array '{key}' has {count} elements, above the {MAX_ARRAY_ELEMENTS} limit", count_pos)
    min_elem = 8 if etype == T_STRING else _SCALARS[etype][2]
    if count * min_elem > cur.end - cur.pos:
        raise cur.fail(
            f"file truncated: array '{key}' of {count} elements needs at least {count * min_elem} bytes "
            f"but only {cur.end - cur.pos} remain",
            count_pos,
        )
    keep = count <= KEEP_ARRAY_VALUES_MAX
    if etype == T_STRING:
        start = cur.pos
        (walk_unique_strings if unique else skip_strings)(cur, count, key)
        if keep:
            cur.pos = start
            vals = tuple(cur.string_value(f"element {i} of array '{key}'") for i in range(count))
            return GGUFArray("string", count, vals)
        return GGUFArray("string", count, None)
    name, fmt, size = _SCALARS[etype]
    values: tuple[Any, ...] | None = None
    if keep:
        values = struct.unpack_from(f"<{count}{fmt[1]}", cur.buf, cur.pos)
    cur.pos += count * size
    return GGUFArray(name, count, values)


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    cur.need(4, "magic")
    magic = bytes(cur.buf[0:4])
    if magic != GGUF_MAGIC:
        raise cur.fail(f"bad magic {magic!r}, expected b'GGUF' (not a GGUF file)", 0)
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        swapped = struct.unpack("<I", struct.pack(">I", version))[0]
        if swapped in SUPPORTED_VERSIONS:
            raise cur.fail("big-endian GGUF files are not supported on this machine", 4)
        if version == 1:
            raise cur.fail("GGUF version 1 is obsolete and not supported; re-convert the model", 4)
        raise cur.fail(f"unsupported GGUF version {version} (supported: 2, 3)", 4)
    n_tensors = cur.u64("tensor count")
    if n_tensors * _MIN_TENSOR_INFO_BYTES > cur.end - cur.pos:
        raise cur.fail(
            f"tensor count {n_tensors} cannot fit in the {cur.end - cur.pos} bytes left: "
            "corrupt or truncated",
            8,
        )
    n_kv = cur.u64("key/value count")
    if n_kv * _MIN_KV_BYTES > cur.end - cur.pos:
        raise cur.fail(
            f"key/value count {n_kv} cannot fit in the {cur.end - cur.pos} bytes left: corrupt or truncated",
            16,
        )
    return version, n_tensors, n_kv


def _read_kvs(cur: _Cursor, n_kv: int) -> tuple[dict[str, Any], dict[str, str]]:
    kv: dict[str, Any] = {}
    kv_types: dict[str, str] = {}
    for i in range(n_kv):
        key_pos = cur.pos
        key = cur.string(f"key {i}", MAX_KEY_BYTES)
        if not key:
            raise cur.fail(f"key {i} is empty", key_pos)
        label = shown(key)  # the key as reasons quote it
        if key in kv:
            raise cur.fail(f"duplicate key '{label}'", key_pos)
        vtype = cur.u32(f"value type of key '{label}'")
        kv[key] = _read_value(cur, vtype, label, unique=key == UNIQUE_STRINGS_KEY)
        kv_types[key] = TYPE_NAMES.get(vtype, str(vtype))
    return kv, kv_types


def _read_alignment(cur: _Cursor, kv: dict[str, Any], kv_types: dict[str, str]) -> int:
    if "general.alignment" not in kv:
        return DEFAULT_ALIGNMENT
    if kv_types["general.alignment"] != "uint32":
        raise cur.fail(f"general.alignment must be uint32, not {kv_types['general.alignment']}")
    alignment = int(kv["general.alignment"])
    if alignment == 0 or alignment & (alignment - 1):
        raise cur.fail(f"general.alignment {alignment} is not a power of 2")
    return alignment


def _read_tensor_infos(
    cur: _Cursor, n_tensors: int, known_types: dict[int, tuple[str, int, int]]
) -> list[RawTensor]:
    tensors: list[RawTensor] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        info_pos = cur.pos
        name = cur.string(f"name of tensor {i}", MAX_TENSOR_NAME_BYTES)
        label = shown(name)
        if name in seen:
            raise cur.fail(f"duplicate tensor name '{label}'", info_pos)
        seen.add(name)
        dims_pos = cur.pos
        n_dims = cur.u32(f"n_dims of tensor '{label}'")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor '{label}' has n_dims {n_dims}, outside 1..{MAX_DIMS}", dims_pos)
        shape: list[int] = []
        n_elems = 1
        for d in range(n_dims):
            dim = cur.u64(f"dimension {d} of tensor '{label}'")
            if dim == 0:
                raise cur.fail(f"tensor '{label}' has a zero-sized dimension {d}", cur.pos - 8)
            if dim > INT64_MAX or n_elems > INT64_MAX // dim:
                raise cur.fail(f"tensor '{label}' shape overflows 64-bit element counts", cur.pos - 8)
            n_elems *= dim
            shape.append(dim)
        type_pos = cur.pos
        gtype = cur.u32(f"type of tensor '{label}'")
        known = known_types.get(gtype)
        if known is None:
            raise cur.fail(f"tensor '{label}' has unknown ggml type {gtype}", type_pos)
        type_name, block_size, _ = known
        if shape[0] % block_size:
            raise cur.fail(
                f"tensor '{label}' row of {shape[0]} elements is not a multiple of the "
                f"{type_name} block size {block_size}",
                type_pos,
            )
        offset = cur.u64(f"data offset of tensor '{label}'")
        tensors.append(RawTensor(name, tuple(shape), gtype, offset, info_pos))
    return tensors


def parse_gguf(buf: Any, size: int, path: str, known_types: dict[int, tuple[str, int, int]]) -> RawGGUF:
    """Parse header, key/values and tensor infos from `buf` (`size` bytes); no layout checks.

    `known_types` maps a ggml type id to (name, block size, bytes per block).
    """
    cur = _Cursor(buf, size, path)
    version, n_tensors, n_kv = _read_header(cur)
    kv, kv_types = _read_kvs(cur, n_kv)
    alignment = _read_alignment(cur, kv, kv_types)
    tensors = _read_tensor_infos(cur, n_tensors, known_types)
    data_offset = -(-cur.pos // alignment) * alignment
    return RawGGUF(version, kv, kv_types, tuple(tensors), alignment, data_offset, size)
