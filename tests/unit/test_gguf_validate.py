"""The GGUF validator rejects malformed and hostile files with a specific reason, quickly."""

from __future__ import annotations

import dataclasses
import errno
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edge.cli import main
from edge.errors import InvalidGGUF, ModelNotFound
from edge.gguf import GGUFInfo, validate_gguf
from tests.ggufgen import (
    ARRAY,
    FLOAT32,
    INT32,
    STRING,
    UINT32,
    UINT64,
    RawGGUF,
    RawTensorSpec,
    write_tiny_model,
)

Q8_0 = 8


def _raw(mutate: Callable[[RawGGUF], None]) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        g = RawGGUF.minimal()
        mutate(g)
        return g.write(path)

    return build


def _bytes(data: bytes) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        path.write_bytes(data)
        return path

    return build


def _patched(mutate: Callable[[bytearray], None]) -> Callable[[Path], Path]:
    def build(path: Path) -> Path:
        data = bytearray(RawGGUF.minimal().to_bytes())
        mutate(data)
        path.write_bytes(bytes(data))
        return path

    return build


def _set(attr: str, value: object) -> Callable[[RawGGUF], None]:
    return lambda g: setattr(g, attr, value)


def _add_kv(key: str, vtype: int, value: object) -> Callable[[RawGGUF], None]:
    return lambda g: g.kvs.append((key, vtype, value))


def _tensor(i: int, **changes: object) -> Callable[[RawGGUF], None]:
    def mutate(g: RawGGUF) -> None:
        for k, v in changes.items():
            setattr(g.tensors[i], k, v)

    return mutate


def _raw_kv_bytes(payload: bytes) -> Callable[[RawGGUF], None]:
    def mutate(g: RawGGUF) -> None:
        g.raw_kv_bytes = payload
        g.n_kv_override = len(g.kvs) + 1

    return mutate


def _deep_nested(g: RawGGUF) -> None:
    # array of array of array ... : element type ARRAY at every level
    payload = b"".join(struct.pack("<IQ", ARRAY, 1) for _ in range(64)) + struct.pack("<IQ", UINT32, 0)
    _raw_kv_bytes(struct.pack("<Q", 4) + b"deep" + struct.pack("<I", ARRAY) + payload)(g)


def _overlap(g: RawGGUF) -> None:
    g.tensors[1].offset = 32  # first tensor is 256 bytes from offset 0


def _gap(g: RawGGUF) -> None:
    g.tensors[1].offset = 288  # aligned, inside the file, but 32 bytes after the first tensor's end
    g.trailing_bytes = 64


def _lying_count() -> RawGGUF:
    g = RawGGUF.minimal()
    g.n_tensors_override = 3  # two tensor infos follow, then the file ends
    return g


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


# (case id, builder, expected fragment of the reason)
CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    ("empty", _bytes(b""), "empty file"),
    ("directory", _directory, "is a directory"),
    ("wrong-magic", _raw(_set("magic", b"GGML")), "bad magic"),
    ("text-file", _bytes(b"hello world, this is not a model\n" * 4), "bad magic"),
    ("version-7", _raw(_set("version", 7)), "unsupported GGUF version 7"),
    ("version-1", _raw(_set("version", 1)), "version 1 is obsolete"),
    ("big-endian", _raw(_set("version", 3 << 24)), "big-endian"),
    ("absurd-tensor-count", _raw(_set("n_tensors_override", 1 << 62)), "tensor count"),
    ("absurd-kv-count", _raw(_set("n_kv_override", (1 << 64) - 1)), "key/value count"),
    ("key-length-2^63", _raw(_raw_kv_bytes(struct.pack("<Q", 1 << 63))), "above the 1073741824-byte limit"),
    (
        "string-value-huge",
        _raw(_raw_kv_bytes(struct.pack("<Q", 1) + b"k" + struct.pack("<IQ", STRING, 1 << 40))),
        "has length 1099511627776",
    ),
    (
        "array-length-huge",
        _raw(_raw_kv_bytes(struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", ARRAY, UINT64, 1 << 29))),
        "array 'k' of 536870912",
    ),
    (
        "array-length-over-limit",
        _raw(_raw_kv_bytes(struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", ARRAY, UINT32, 1 << 62))),
        "above the 1073741824 limit",
    ),
    ("nested-arrays-deep", _raw(_deep_nested), "nested array"),
    (
        "unknown-value-type",
        _raw(_raw_kv_bytes(struct.pack("<Q", 1) + b"k" + struct.pack("<I", 99))),
        "unknown value type 99",
    ),
    (
        "unknown-array-elem-type",
        _raw(_raw_kv_bytes(struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", ARRAY, 42, 1))),
        "array of unknown value type 42",
    ),
    ("empty-key", _raw(_add_kv("", UINT32, 1)), "is empty"),
    ("duplicate-key", _raw(_add_kv("llama.block_count", UINT32, 2)), "duplicate key 'llama.block_count'"),
    ("alignment-not-pow2", _raw(_add_kv("general.alignment", UINT32, 48)), "not a power of 2"),
    ("alignment-zero", _raw(_add_kv("general.alignment", UINT32, 0)), "not a power of 2"),
    ("alignment-wrong-type", _raw(_add_kv("general.alignment", INT32, 32)), "must be uint32"),
    ("unknown-ggml-type", _raw(_tensor(0, ggml_type=99)), "unknown ggml type 99"),
    ("removed-ggml-type-q4_2", _raw(_tensor(0, ggml_type=4)), "unknown ggml type 4"),
    ("n-dims-0", _raw(_tensor(0, n_dims=0, shape=())), "n_dims 0"),
    ("n-dims-9", _raw(_tensor(0, n_dims=9)), "n_dims 9"),
    ("zero-dim", _raw(_tensor(1, shape=(32, 0))), "zero-sized dimension 1"),
    ("shape-overflow", _raw(_tensor(0, shape=(1 << 40, 1 << 40))), "overflows"),
    ("row-not-block-multiple", _raw(_tensor(0, ggml_type=Q8_0, shape=(33, 2))), "not a multiple"),
    ("tensor-name-too-long", _raw(_tensor(0, name="x" * 64)), "is 64 bytes, above the 63-byte limit"),
    ("duplicate-tensor-name", _raw(_tensor(1, name="blk.0.t0")), "duplicate tensor name 'blk.0.t0'"),
    ("offset-past-end", _raw(_tensor(1, offset=1 << 30)), "past the end of the file"),
    ("misaligned-offset", _raw(_tensor(1, offset=260)), "not aligned to 32"),
    ("overlapping-tensors", _raw(_overlap), "overlaps tensor 'blk.0.t0'"),
    ("gap-between-tensors", _raw(_gap), "leaves a gap"),
    (
        "tensor-count-lies",
        lambda p: _bytes(_lying_count().header_bytes())(p),
        "file truncated: length of name of tensor 2",
    ),
    ("missing-architecture", _raw(lambda g: g.kvs.pop(0)), "missing required key 'general.architecture'"),
    (
        "block-count-is-string",
        _raw(lambda g: g.kvs.__setitem__(1, ("llama.block_count", STRING, "30"))),
        "must be an integer",
    ),
    (
        "head-count-kv-wrong-length",
        _raw(_add_kv("llama.attention.head_count_kv", ARRAY, (UINT32, [1, 2, 3]))),
        "must be an integer or 1 integers",
    ),
    ("truncated-in-header", _patched(lambda d: d.__delitem__(slice(20, None))), "truncated"),
    ("truncated-in-data", _patched(lambda d: d.__delitem__(slice(len(d) - 100, None))), "past the end"),
]


@pytest.mark.parametrize(("case", "build", "reason"), CASES, ids=[c[0] for c in CASES])
def test_malformed_file_is_rejected_with_specific_reason(
    tmp_path: Path, case: str, build: Callable[[Path], Path], reason: str
) -> None:
    path = build(tmp_path / f"{case}.gguf")
    t0 = time.perf_counter()
    with pytest.raises(InvalidGGUF) as info:
        validate_gguf(path)
    assert time.perf_counter() - t0 < 1.0
    assert reason in info.value.reason, info.value.reason
    assert info.value.path == str(path)
    assert "\n" not in str(info.value)


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 20


def test_every_truncation_of_the_header_region_is_rejected(tmp_path: Path) -> None:
    data = RawGGUF.minimal(n_tensors=3).to_bytes()
    header_len = len(RawGGUF.minimal(n_tensors=3).header_bytes())
    offsets = list(range(1, header_len + 1)) + list(range(header_len + 1, len(data), 37))
    path = tmp_path / "t.gguf"
    for n in offsets:
        path.write_bytes(data[:n])
        with pytest.raises(InvalidGGUF) as info:
            validate_gguf(path)
        assert "truncated" in info.value.reason or "bad magic" in info.value.reason, (n, info.value.reason)
    path.write_bytes(data)
    assert validate_gguf(path).file_size_bytes == len(data)


def test_truncated_real_sized_model_rejected(tmp_path: Path) -> None:
    src = write_tiny_model(tmp_path / "m.gguf", n_layer=4)
    data = src.read_bytes()
    for n in (len(data) // 3, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:n])
        with pytest.raises(InvalidGGUF, match="truncated"):
            validate_gguf(tmp_path / "cut.gguf")


def test_missing_file_is_model_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound) as info:
        validate_gguf(tmp_path / "nope.gguf")
    assert "no such file" in str(info.value)


def test_unreadable_file(tmp_path: Path) -> None:
    path = RawGGUF.minimal().write(tmp_path / "locked.gguf")

    def deny(p: str) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", p)

    with pytest.raises(InvalidGGUF, match="cannot read file: Permission denied"):
        validate_gguf(path, opener=deny)


def test_max_file_bytes_limit(tmp_path: Path) -> None:
    path = RawGGUF.minimal().write(tmp_path / "m.gguf")
    with pytest.raises(InvalidGGUF, match="above the limit"):
        validate_gguf(path, max_file_bytes=100)
    assert validate_gguf(path, max_file_bytes=1 << 20).version == 3


def test_huge_vocabulary_is_walked_not_kept(tmp_path: Path) -> None:
    g = RawGGUF.minimal()
    g.kvs[-1] = ("tokenizer.ggml.tokens", ARRAY, (STRING, [f"tok{i}" for i in range(20000)]))
    g.kvs.append(("tokenizer.ggml.scores", ARRAY, (FLOAT32, [0.0] * 20000)))
    info = validate_gguf(g.write(tmp_path / "v.gguf"))
    assert info.n_vocab == 20000
    assert "tokenizer.ggml.tokens" not in info.metadata


def test_huge_strings_are_not_kept(tmp_path: Path) -> None:
    g = RawGGUF.minimal()
    g.kvs.append(("general.description", STRING, "x" * (5 << 20)))
    info = validate_gguf(g.write(tmp_path / "long.gguf"))
    assert "general.description" not in info.metadata
    g.kvs.append(("tokenizer.chat_template", STRING, "{{ x }}" * (1 << 20)))
    with pytest.raises(InvalidGGUF, match=r"tokenizer\.chat_template' is 7340032 bytes, above"):
        validate_gguf(g.write(tmp_path / "long-template.gguf"))


def test_valid_raw_file_layout_facts(tmp_path: Path) -> None:
    g = RawGGUF.minimal(n_tensors=3)
    g.tensors.append(RawTensorSpec("output.weight", (64, 4), ggml_type=Q8_0))
    info = validate_gguf(g.write(tmp_path / "ok.gguf"))
    assert [t.name for t in info.tensors] == ["blk.0.t0", "blk.0.t1", "blk.0.t2", "output.weight"]
    assert info.tensors[3].n_bytes == 64 * 4 // 32 * 34
    assert info.tensors[0].offset == info.data_offset
    assert info.data_offset % 32 == 0
    assert info.quant_mix == {"F32": 3, "Q8_0": 1}


@pytest.mark.parametrize(
    "case", ["wrong-magic", "overlapping-tensors", "nested-arrays-deep", "empty", "directory"]
)
def test_inspect_command_reports_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    build = next(b for c, b, _ in CASES if c == case)
    path = build(tmp_path / f"{case}.gguf")
    assert main(["inspect", str(path)]) == 2  # one exit-status map: an invalid model is a usage error
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge: error: invalid GGUF file")
    assert len(err.splitlines()) == 1


def test_random_header_corruption_never_escapes_as_another_error(tmp_path: Path) -> None:
    """Seeded fuzzing: flipped bytes anywhere before the data end in InvalidGGUF or a valid file."""
    import random

    src = write_tiny_model(tmp_path / "m.gguf", n_layer=2, chat_template="{{ x }}")
    data = src.read_bytes()
    header_len = validate_gguf(src).data_offset
    rng = random.Random(1234)
    path = tmp_path / "fuzz.gguf"
    outcomes = {"valid": 0, "invalid": 0}
    t0 = time.perf_counter()
    for _ in range(400):
        buf = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(header_len)] = rng.randrange(256)
        path.write_bytes(bytes(buf))
        try:
            validate_gguf(path)
            outcomes["valid"] += 1
        except InvalidGGUF as exc:
            assert "\n" not in str(exc)
            outcomes["invalid"] += 1
    assert outcomes["invalid"] > 100
    assert time.perf_counter() - t0 < 20


def test_validated_parses_a_file_once_and_a_rewritten_file_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from edge.gguf import validate as v

    path = write_tiny_model(tmp_path / "m.gguf")
    calls: list[Path] = []
    real = v.validate_gguf
    monkeypatch.setattr(v, "validate_gguf", lambda p: calls.append(Path(p)) or real(p))
    first = v.validated(path)
    assert v.validated(path) is first and v.validated(str(path)) is first
    assert len(calls) == 1
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # rewritten: another identity
    assert v.validated(path) == first and len(calls) == 2
    path.write_bytes(b"GGUF" + b"\0" * 8)  # broken now: the error, and it is never kept
    for _ in range(2):
        with pytest.raises(InvalidGGUF):
            v.validated(path)
    assert len(calls) == 4
    with pytest.raises(ModelNotFound):
        v.validated(tmp_path / "gone.gguf")


def test_a_validated_file_is_kept_across_starts_and_checked_again_once_changed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second process (the in-memory cache cleared) reads the kept facts instead of re-walking
    the vocabulary; a rewrite, a damaged entry or another CHECKS_VERSION validates anew."""
    import os

    from edge.gguf import checked
    from edge.gguf import validate as v

    kept = checked.CheckedFiles(root=lambda: tmp_path / "cache")
    path = write_tiny_model(tmp_path / "m.gguf")
    calls: list[Path] = []
    real = v.validate_gguf
    monkeypatch.setattr(v, "validate_gguf", lambda p: calls.append(Path(p)) or real(p))

    def new_start() -> GGUFInfo:
        v._VALIDATED.clear()
        return v.validated(path, kept)

    first = new_start()
    assert new_start() == first and len(calls) == 1  # read back, not parsed
    assert new_start().tensors == first.tensors and isinstance(first.tensors[0].shape, tuple)
    (entry,) = (tmp_path / "cache" / "gguf-checked").glob("*.json")
    entry.write_text("{not json")
    assert new_start() == first and len(calls) == 2  # damaged: checked again and rewritten
    monkeypatch.setattr(checked, "CHECKS_VERSION", checked.CHECKS_VERSION + 1)
    assert new_start() == first and len(calls) == 3  # a newer validator checks again
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert new_start() == first and len(calls) == 4
    path.write_bytes(b"GGUF" + b"\0" * 8)
    with pytest.raises(InvalidGGUF):
        new_start()
    with pytest.raises(InvalidGGUF):
        new_start()  # a failure is never kept
    assert len(calls) == 6


def test_kept_checks_round_trip_every_value_kind_and_stay_bounded(tmp_path: Path) -> None:
    from edge.gguf import checked
    from edge.gguf.reader import GGUFArray, SkippedString

    info = validate_gguf(write_tiny_model(tmp_path / "m.gguf"))
    meta = {**info.metadata, "a": GGUFArray("string", 3, ("x", "y", "z")),
            "big": GGUFArray("int32", 10**6, None), "long": SkippedString(1 << 20), "f": 1e-6, "flag": True}
    rich = dataclasses.replace(info, metadata=meta, n_head_kv=(2, 2), swa_layers=(True, False))
    assert checked.from_text(checked.to_text(rich)) == rich
    assert checked.from_text('{"version": 0, "info": {}}') is None
    kept = checked.CheckedFiles(root=lambda: tmp_path / "c")
    for i in range(checked.KEEP_FILES_MAX + 5):
        kept.save(f"k{i}", info)
    assert len(list((tmp_path / "c" / "gguf-checked").glob("*.json"))) == checked.KEEP_FILES_MAX
