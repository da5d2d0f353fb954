"""A seeded GGUF mutator for fuzzing the validator: it knows the layout, so it aims.

Blind byte flips mostly land in the vocabulary (megabytes of token strings) and
test little; this mutator first maps every field of a real file (header counts,
each key/value's key length, type, string length, array element type and count,
each tensor's name length, n_dims, dims, ggml type and data offset) and then
overwrites those fields with boundary values (0, ±1, 2^31, 2^32, 2^63, 2^64-1,
negative-as-unsigned, past the end of the file, another tensor's offset), plus
blind flips and truncations in each region. Every mutation is an in-place patch
of the file's head (and optionally a truncation), so a case is applied and undone
with a few small writes, and one case is reproducible from (seed, case index).
"""

from __future__ import annotations

import mmap
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path

from edge.gguf.reader import parse_gguf
from edge.gguf.validate import known_types

T_STRING, T_ARRAY = 8, 9
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
BLIND_KIB = 64  # blind flips land in the first 64 KiB (header, general.*, hparams, vocabulary start)


@dataclass(frozen=True)
class Mutation:
    """One fuzz case: patches (file offset, new bytes) over the original, then an optional cut."""

    kind: str  # the class, e.g. "kv.array_count"
    detail: str  # what exactly changed, for a failure report
    patches: tuple[tuple[int, bytes], ...] = ()
    truncate_at: int | None = None


@dataclass(frozen=True)
class KVField:
    key: str
    key_len_pos: int
    key_len: int
    type_pos: int
    vtype: int
    value_pos: int
    value_len: int  # bytes of the whole value (for a string: length prefix + text)
    elem_type: int | None = None  # arrays only
    count: int | None = None  # arrays only


@dataclass(frozen=True)
class TensorField:
    name: str
    info_pos: int
    name_len: int
    n_dims: int
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def n_dims_pos(self) -> int:
        return self.info_pos + 8 + self.name_len

    def dim_pos(self, d: int) -> int:
        return self.n_dims_pos + 4 + 8 * d

    @property
    def type_pos(self) -> int:
        return self.dim_pos(self.n_dims)

    @property
    def offset_pos(self) -> int:
        return self.type_pos + 4


@dataclass(frozen=True)
class Layout:
    """Where every field of a valid GGUF file is, found once before fuzzing."""

    size: int
    n_tensors: int
    n_kv: int
    kvs: tuple[KVField, ...]
    tensors: tuple[TensorField, ...]
    table_pos: int  # first tensor info
    table_end: int  # end of the last tensor info
    data_offset: int
    alignment: int
    head: bytes = field(repr=False)  # the original bytes patches may touch: all before the data, and some

    @property
    def head_len(self) -> int:
        return len(self.head)


def _value_len(buf: bytes | mmap.mmap, pos: int, vtype: int) -> tuple[int, int | None, int | None]:
    """(bytes, array element type, array count) of a value at `pos` in a file known to be valid."""
    if vtype in SCALAR_SIZES:
        return SCALAR_SIZES[vtype], None, None
    if vtype == T_STRING:
        return 8 + struct.unpack_from("<Q", buf, pos)[0], None, None
    etype, count = struct.unpack_from("<IQ", buf, pos)
    if etype in SCALAR_SIZES:
        return 12 + count * SCALAR_SIZES[etype], etype, count
    end = pos + 12
    for _ in range(count):
        end += 8 + struct.unpack_from("<Q", buf, end)[0]
    return end - pos, etype, count


def read_layout(path: Path) -> Layout:
    """Map a valid file: tensors from edge's own reader, key/value positions by walking them."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        raw = parse_gguf(buf, len(buf), str(path), known_types())
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
        kvs: list[KVField] = []
        pos = 24
        for _ in range(n_kv):
            (key_len,) = struct.unpack_from("<Q", buf, pos)
            key = bytes(buf[pos + 8 : pos + 8 + key_len]).decode()
            type_pos = pos + 8 + key_len
            (vtype,) = struct.unpack_from("<I", buf, type_pos)
            n, etype, count = _value_len(buf, type_pos + 4, vtype)
            kvs.append(KVField(key, pos, key_len, type_pos, vtype, type_pos + 4, n, etype, count))
            pos = type_pos + 4 + n
        head = bytes(buf[: min(len(buf), raw.data_offset + 4096)])
        tensors = tuple(
            TensorField(t.name, t.info_pos, struct.unpack_from("<Q", buf, t.info_pos)[0], len(t.shape),
                        t.shape, t.ggml_type, t.offset)
            for t in raw.tensors
        )
    table_end = tensors[-1].offset_pos + 8 if tensors else pos
    return Layout(raw.file_size_bytes, n_tensors, n_kv, tuple(kvs), tensors, pos, table_end,
                  raw.data_offset, raw.alignment, head)


def _u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def _huge(rng: random.Random, orig: int, file_size: int, bits: int = 64) -> int:
    """A boundary value for a count, length or size field that held `orig`."""
    top = (1 << bits) - 1
    return rng.choice([
        0, 1, orig - 1, orig + 1, orig * 2, -orig, -1, top, top >> 1, (top >> 1) + 1, 1 << 31,
        (1 << 32) - 1, 1 << 32, 1 << 30, (1 << 30) + 1, file_size, file_size - orig,
        rng.getrandbits(bits), rng.getrandbits(bits // 2),
    ]) & top


def _mutate_header(rng: random.Random, lay: Layout) -> Mutation:
    part = rng.choice(["magic", "version", "n_tensors", "n_kv"])
    if part == "magic":
        new = rng.choice([b"GGML", b"gguf", b"FUGG", b"\0\0\0\0", rng.randbytes(4)])
        return Mutation("header.magic", f"magic -> {new!r}", ((0, new),))
    if part == "version":
        v = rng.choice([0, 1, 2, 4, 7, 3 << 24, 2 << 24, 0xFFFFFFFF, rng.getrandbits(32)])
        return Mutation("header.version", f"version -> {v}", ((4, _u32(v)),))
    pos, orig = (8, lay.n_tensors) if part == "n_tensors" else (16, lay.n_kv)
    v = _huge(rng, orig, lay.size)
    return Mutation(f"header.{part}", f"{part} {orig} -> {v}", ((pos, _u64(v)),))


def _mutate_kv(rng: random.Random, lay: Layout) -> Mutation:
    kv = rng.choice(lay.kvs)
    arrays = kv.vtype == T_ARRAY
    fields = ["key_len", "key_bytes", "type", "value_bytes"]
    fields += ["str_len"] if kv.vtype == T_STRING else []
    fields += ["elem_type", "count", "count"] if arrays else []
    fields += ["scalar"] * 2 if kv.vtype in SCALAR_SIZES else []
    part = rng.choice(fields)
    where = f"key '{kv.key}'"
    if part == "key_len":
        v = _huge(rng, kv.key_len, lay.size)
        return Mutation("kv.key_len", f"{where} key length {kv.key_len} -> {v}", ((kv.key_len_pos, _u64(v)),))
    if part == "key_bytes":
        same = [o for o in lay.kvs if o.key_len == kv.key_len and o is not kv]
        if same and rng.random() < 0.5:  # rename it to another key: a duplicate
            other = rng.choice(same)
            return Mutation("kv.duplicate_key", f"{where} renamed '{other.key}'",
                            ((kv.key_len_pos + 8, other.key.encode()),))
        i = rng.randrange(kv.key_len)
        b = rng.choice([0, 0x0A, 0xFF, 0xC3, 0x27, rng.randrange(256)])
        return Mutation("kv.key_bytes", f"{where} byte {i} -> {b:#x}",
                        ((kv.key_len_pos + 8 + i, bytes([b])),))
    if part == "type":
        v = rng.choice([*SCALAR_SIZES, T_STRING, T_ARRAY, 13, 99, 0xFFFFFFFF, rng.getrandbits(32)])
        return Mutation("kv.value_type", f"{where} type {kv.vtype} -> {v}", ((kv.type_pos, _u32(v)),))
    if part == "str_len":
        orig = kv.value_len - 8
        v = _huge(rng, orig, lay.size)
        return Mutation("kv.string_len", f"{where} string length {orig} -> {v}", ((kv.value_pos, _u64(v)),))
    if part == "elem_type":
        v = rng.choice([*SCALAR_SIZES, T_STRING, T_ARRAY, 13, 77, 0xFFFFFFFF])
        return Mutation("kv.array_type", f"{where} element type {kv.elem_type} -> {v}",
                        ((kv.value_pos, _u32(v)),))
    if part == "count":
        assert kv.count is not None
        v = _huge(rng, kv.count, lay.size)
        return Mutation("kv.array_count", f"{where} count {kv.count} -> {v}", ((kv.value_pos + 4, _u64(v)),))
    if part == "scalar":
        size = SCALAR_SIZES[kv.vtype]
        v = _huge(rng, 0, lay.size, size * 8)
        return Mutation("kv.scalar", f"{where} value -> {v:#x}",
                        ((kv.value_pos, v.to_bytes(size, "little")),))
    n = min(kv.value_len, 4096)  # flip bytes inside the value (template text, vocabulary, ...)
    patches = tuple(
        (kv.value_pos + rng.randrange(n), bytes([rng.randrange(256)])) for _ in range(rng.randint(1, 4))
    )
    return Mutation("kv.value_bytes", f"{where} value bytes at {[p for p, _ in patches]}", patches)


def _mutate_tensor(rng: random.Random, lay: Layout) -> Mutation:
    if not lay.tensors:  # a vocabulary-only file
        return _mutate_header(rng, lay)
    i = rng.randrange(len(lay.tensors))
    t = lay.tensors[i]
    part = rng.choice(["name_len", "name", "n_dims", "dim", "dim", "overflow", "type", "offset", "offset"])
    where = f"tensor {i} '{t.name}'"
    if part == "name_len":
        v = rng.choice([_huge(rng, t.name_len, lay.size), 63, 64, 200])
        return Mutation("tensor.name_len", f"{where} name length {t.name_len} -> {v}",
                        ((t.info_pos, _u64(v)),))
    if part == "name":
        same = [o for o in lay.tensors if o.name_len == t.name_len and o is not t]
        if same and rng.random() < 0.5:
            other = rng.choice(same)
            return Mutation("tensor.duplicate_name", f"{where} renamed '{other.name}'",
                            ((t.info_pos + 8, other.name.encode()),))
        j = rng.randrange(t.name_len)
        b = rng.choice([0, 0x0A, 0xE2, 0xFF, rng.randrange(256)])
        return Mutation("tensor.name_bytes", f"{where} name byte {j} -> {b:#x}",
                        ((t.info_pos + 8 + j, bytes([b])),))
    if part == "n_dims":
        v = rng.choice([0, 5, 9, t.n_dims + 1, t.n_dims - 1, 0xFFFFFFFF, 1 << 31])
        return Mutation("tensor.n_dims", f"{where} n_dims {t.n_dims} -> {v}", ((t.n_dims_pos, _u32(v)),))
    if part == "dim":
        d = rng.randrange(t.n_dims)
        v = _huge(rng, t.shape[d], lay.size)
        return Mutation("tensor.dim", f"{where} dim {d} {t.shape[d]} -> {v}", ((t.dim_pos(d), _u64(v)),))
    if part == "overflow":  # every dim large: the element count overflows 64 bits (or the file)
        v = rng.choice([1 << 32, 1 << 40, (1 << 63) - 1, 1 << 21])
        patches = tuple((t.dim_pos(d), _u64(v)) for d in range(t.n_dims))
        return Mutation("tensor.dims_overflow", f"{where} every dim -> {v}", patches)
    if part == "type":
        known = list(known_types())
        v = rng.choice([4, 5, 31, 36, 42, 99, 0xFFFFFFFF, rng.choice(known), rng.getrandbits(32)])
        return Mutation("tensor.type", f"{where} ggml type {t.ggml_type} -> {v}", ((t.type_pos, _u32(v)),))
    return _mutate_offset(rng, lay, i)


def _mutate_offset(rng: random.Random, lay: Layout, i: int) -> Mutation:
    t = lay.tensors[i]
    other = lay.tensors[rng.randrange(len(lay.tensors))]
    how, v = rng.choice([
        ("out of file", lay.size - lay.data_offset + rng.randrange(1, 1 << 20) * lay.alignment),
        ("huge", _huge(rng, t.offset, lay.size)),
        ("overlapping", other.offset),
        ("overlapping", other.offset + lay.alignment),
        ("misaligned", t.offset + rng.randrange(1, lay.alignment)),
        ("zero", 0),
        ("last byte", lay.size - lay.data_offset - lay.alignment),
    ])
    return Mutation(f"tensor.offset.{how.replace(' ', '_')}",
                    f"tensor {i} '{t.name}' offset {t.offset} -> {v}", ((t.offset_pos, _u64(v)),))


def _mutate_blind(rng: random.Random, lay: Layout) -> Mutation:
    how = rng.choice(["flip_head", "flip_head", "flip_table", "bits", "truncate", "truncate"])
    if how == "truncate":
        region, lo, hi = rng.choice([
            ("header", 0, 24), ("metadata", 24, lay.table_pos),
            ("tensor_table", lay.table_pos, lay.table_end), ("data", lay.table_end, lay.size),
        ])
        at = rng.randrange(lo, hi)
        return Mutation(f"blind.truncate.{region}", f"file cut to {at} bytes", truncate_at=at)
    if how == "flip_table":
        lo, hi = lay.table_pos, lay.table_end
    else:
        lo, hi = 0, min(lay.head_len, BLIND_KIB << 10)
    n = rng.randint(1, 8)
    if how == "bits":
        positions = [rng.randrange(lo, hi) for _ in range(n)]
        return Mutation("blind.bit_flips", f"bit flips at {positions}",
                        tuple((p, bytes([lay.head[p] ^ 1 << rng.randrange(8)])) for p in positions))
    patches = tuple((rng.randrange(lo, hi), bytes([rng.randrange(256)])) for _ in range(n))
    return Mutation(f"blind.{how}", f"bytes at {[p for p, _ in patches]} randomised", patches)


_AIMED = (_mutate_header, _mutate_kv, _mutate_kv, _mutate_kv, _mutate_tensor, _mutate_tensor,
          _mutate_tensor, _mutate_blind, _mutate_blind, _mutate_blind)


def mutation(layout: Layout, seed: int, case: int) -> Mutation:
    """Case `case` of campaign `seed`: one aimed or blind mutation, sometimes two or three stacked."""
    rng = random.Random(f"{seed}:{case}")
    muts = [rng.choice(_AIMED)(rng, layout) for _ in range(1 if rng.random() < 0.85 else rng.randint(2, 3))]
    if len(muts) == 1:
        return muts[0]
    cuts = [m.truncate_at for m in muts if m.truncate_at is not None]
    return Mutation(
        "stacked." + "+".join(m.kind.split(".")[0] for m in muts),
        "; ".join(m.detail for m in muts),
        tuple(p for m in muts for p in m.patches),
        min(cuts) if cuts else None,
    )
