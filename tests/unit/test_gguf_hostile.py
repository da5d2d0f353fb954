"""What fuzzing a catalog model (tests/model/test_gguf_fuzz.py) found in the validator, one test per class.

- a reason quoted names from the file raw: a newline, a U+2028 or a megabyte-long key split or
  flooded the one-line error;
- a lying key length made the parser copy and decode the rest of the file (seconds);
- tensor name length counted characters where llama.cpp counts bytes;
- values llama.cpp's loader accepts and then GGML_ASSERTs on, killing the process: a repeated
  vocabulary token (also one repeated only up to a NUL, as C reads it), block_count 0 or above
  512, a NaN or negative norm epsilon (at the first decode).
"""

from __future__ import annotations

import random
import struct
import time
from pathlib import Path

import pytest

from edge.cli import main
from edge.errors import InvalidGGUF
from edge.gguf import strings, validate_gguf
from edge.gguf.reader import KEEP_ARRAY_VALUES_MAX, SHOWN_CHARS_MAX, shown
from tests.ggufgen import ARRAY, FLOAT32, STRING, UINT32, RawGGUF


def _rejected(g: RawGGUF, path: Path) -> InvalidGGUF:
    with pytest.raises(InvalidGGUF) as info:
        validate_gguf(g.write(path))
    return info.value


def _one_printable_line(exc: InvalidGGUF) -> None:
    text = str(exc)
    assert len(text.splitlines()) == 1 and text.isprintable(), text
    assert len(exc.reason) < 300, exc.reason


def _unknown_type_under(key: bytes) -> RawGGUF:
    g = RawGGUF.minimal()
    g.raw_kv_bytes = struct.pack("<Q", len(key)) + key + struct.pack("<I", 99)
    g.n_kv_override = len(g.kvs) + 1
    return g


@pytest.mark.parametrize(
    "key", [b"general.na\nme", "a\u2028b".encode(), b"x\x1b[31mred", b"k" * 10_000],
    ids=["newline", "line-separator", "terminal-escape", "10k-key"],
)
def test_reason_quoting_a_hostile_key_stays_one_short_printable_line(tmp_path: Path, key: bytes) -> None:
    exc = _rejected(_unknown_type_under(key), tmp_path / "k.gguf")
    _one_printable_line(exc)
    assert "unknown value type 99" in exc.reason


def test_reason_quoting_a_hostile_tensor_name_stays_one_line(tmp_path: Path) -> None:
    g = RawGGUF.minimal()
    g.tensors[0].name = "blk.0\n.t0"
    g.tensors[1].offset = 32  # overlaps the first, whose name the reason quotes
    exc = _rejected(g, tmp_path / "t.gguf")
    _one_printable_line(exc)
    assert "overlaps tensor 'blk.0\\n.t0'" in exc.reason


def test_reason_quoting_a_hostile_architecture_stays_one_line(tmp_path: Path) -> None:
    g = RawGGUF.minimal()
    g.kvs[0] = ("general.architecture", STRING, "lla\nma")
    exc = _rejected(g, tmp_path / "a.gguf")
    _one_printable_line(exc)
    assert exc.reason == "missing required key 'lla\\nma.block_count'"


def test_inspect_prints_a_hostile_reason_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _unknown_type_under("evil\nkey\u2029".encode()).write(tmp_path / "i.gguf")
    assert main(["inspect", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("edge: error: invalid GGUF file"), err


def test_shown_escapes_and_cuts() -> None:
    assert shown("blk.0.attn_q.weight") == "blk.0.attn_q.weight"
    assert shown("a\nb\u2028c\x00") == "a\\nb\\u2028c\\x00"
    assert shown("x" * 1000) == "x" * SHOWN_CHARS_MAX + "…"


def test_lying_key_length_is_refused_before_copying(tmp_path: Path) -> None:
    g = RawGGUF.minimal()
    g.raw_kv_bytes = struct.pack("<Q", 2 << 20)  # a 2 MiB key, and the file holds it
    g.n_kv_override = len(g.kvs) + 1
    g.trailing_bytes = 3 << 20
    t0 = time.perf_counter()
    exc = _rejected(g, tmp_path / "long-key.gguf")
    assert time.perf_counter() - t0 < 0.5
    assert exc.reason == f"key {len(g.kvs)} is {2 << 20} bytes, above the 65536-byte limit"


def test_tensor_name_limit_counts_bytes_as_llama_cpp_does(tmp_path: Path) -> None:
    g = RawGGUF.minimal()
    g.tensors[0].name = "é" * 32  # 32 characters, 64 bytes: llama.cpp refuses it
    assert "name of tensor 0 is 64 bytes, above the 63-byte limit" in _rejected(g, tmp_path / "n.gguf").reason
    g.tensors[0].name = "é" * 31 + "x"  # 63 bytes: accepted
    assert validate_gguf(g.write(tmp_path / "ok.gguf")).tensors[0].name == "é" * 31 + "x"


def _with_tokens(tokens: list[str | bytes]) -> RawGGUF:
    g = RawGGUF.minimal()
    g.kvs[-1] = ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    return g


@pytest.mark.parametrize(
    ("tokens", "repeat"),
    [
        (["a", "b", "c", "b"], "element 3 of array 'tokenizer.ggml.tokens' repeats an earlier entry b'b'"),
        ([b"li", b"li\0x"], "element 1 of array 'tokenizer.ggml.tokens' repeats an earlier entry b'li'"),
        ([f"t{i}" for i in range(20_000)] + ["t7"], "element 20000 of array"),  # walked, not kept
    ],
    ids=["repeat", "repeat-up-to-nul", "large-vocabulary"],
)
def test_repeated_token_is_refused(tmp_path: Path, tokens: list[str | bytes], repeat: str) -> None:
    assert repeat in _rejected(_with_tokens(tokens), tmp_path / "v.gguf").reason


def test_the_fast_walk_decides_as_the_checked_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """String arrays take a fast loop and whole-list checks first (strings._fast_end); random
    vocabularies (repeats, empty tokens, NULs, a truncated last token) get the same verdict and
    the same reason as from the element-by-element walk alone."""
    rng = random.Random(7)
    cases = []
    for _ in range(200):
        tokens: list[str | bytes] = [bytes(rng.choice(b"ab\0") for _ in range(rng.randint(0, 3)))
                                     for _ in range(rng.randint(1, 12))]
        g = _with_tokens(tokens)
        n_merges = rng.choice((0, 2, KEEP_ARRAY_VALUES_MAX + 2))  # kept, or only walked
        g.kvs.append(("tokenizer.ggml.merges", ARRAY, (STRING, [b"a b"] * n_merges)))
        cases.append((g, rng.random() < 0.3))  # some files cut inside their last merge

    def run() -> list[str]:
        out = []
        for i, (g, cut) in enumerate(cases):
            path = g.write(tmp_path / f"{i}.gguf")
            data = path.read_bytes()
            if cut and (k := data.rfind(b"a b")) > 0:
                path.write_bytes(data[: k + 1])
            try:
                out.append(f"ok {validate_gguf(path).n_vocab}")
            except InvalidGGUF as exc:
                out.append(exc.reason)
        return out

    fast = run()
    monkeypatch.setattr(strings, "_fast_end", lambda cur, count, texts=None: None)
    assert fast == run()
    assert {o.split()[0] for o in fast} >= {"ok", "element", "file"}  # accepted, repeats, truncations


def test_empty_tokens_may_repeat_and_other_arrays_may_too(tmp_path: Path) -> None:
    g = _with_tokens(["a", "", "b", "", "\0"])  # llama.cpp renames each empty token [EMPTY_i]
    g.kvs.append(("tokenizer.ggml.merges", ARRAY, (STRING, ["a b", "a b"])))
    assert validate_gguf(g.write(tmp_path / "ok.gguf")).n_vocab == 5


@pytest.mark.parametrize(("n_layer", "ok"), [(0, False), (1, True), (512, True), (513, False)])
def test_block_count_within_llama_cpp_max_layers(tmp_path: Path, n_layer: int, ok: bool) -> None:
    g = RawGGUF.minimal()
    g.kvs[1] = ("llama.block_count", UINT32, n_layer)
    if ok:
        assert validate_gguf(g.write(tmp_path / "ok.gguf")).n_layer == n_layer
    else:
        assert _rejected(g, tmp_path / "l.gguf").reason == (
            f"key 'llama.block_count' is {n_layer}, outside 1..512"
        )


@pytest.mark.parametrize(
    ("vtype", "value", "ok"),
    [(FLOAT32, 1e-5, True), (FLOAT32, 0.0, True), (FLOAT32, float("nan"), False), (FLOAT32, -1e-6, False),
     (FLOAT32, float("inf"), False), (STRING, "1e-5", False)],
)
def test_norm_epsilon_is_finite_and_not_negative(tmp_path: Path, vtype: int, value: object, ok: bool) -> None:
    g = RawGGUF.minimal()
    g.kvs.append(("llama.attention.layer_norm_rms_epsilon", vtype, value))
    if ok:
        assert validate_gguf(g.write(tmp_path / "ok.gguf")).n_layer == 1
    else:
        reason = _rejected(g, tmp_path / "e.gguf").reason
        assert reason.startswith("key 'llama.attention.layer_norm_rms_epsilon' must be a finite number >= 0")
