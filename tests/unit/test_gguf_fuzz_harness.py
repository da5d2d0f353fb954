"""The GGUF fuzzer itself: it aims where it says, restores the file, is reproducible, and reports a
crash, a hang, a bad reason and a misbehaving `edge inspect` (so the campaign test can fail)."""

from __future__ import annotations

import hashlib
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from edge.errors import InvalidGGUF
from edge.gguf import validate_gguf
from tests.gguf_fuzz import MutantFile, inspect_problem, reason_class, run_campaign
from tests.gguf_mutator import T_ARRAY, T_STRING, mutation, read_layout
from tests.ggufgen import write_tiny_model

HERE = "tests.unit.test_gguf_fuzz_harness"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny.gguf", n_layer=2, chat_template="{{ x }}")


def test_layout_finds_every_field_where_the_file_has_it(tiny: Path) -> None:
    lay = read_layout(tiny)
    data = tiny.read_bytes()
    info = validate_gguf(tiny)
    assert (lay.n_tensors, lay.data_offset, lay.size) == (len(info.tensors), info.data_offset, len(data))
    assert lay.n_kv == len(lay.kvs)
    assert {k.key for k in lay.kvs} >= {"general.architecture", "llama.block_count"}
    for kv in lay.kvs:
        assert data[kv.key_len_pos + 8 : kv.key_len_pos + 8 + kv.key_len].decode() == kv.key
        assert struct.unpack_from("<I", data, kv.type_pos)[0] == kv.vtype
        if kv.vtype == T_ARRAY:
            assert struct.unpack_from("<IQ", data, kv.value_pos) == (kv.elem_type, kv.count)
        elif kv.vtype == T_STRING:
            assert struct.unpack_from("<Q", data, kv.value_pos)[0] == kv.value_len - 8
    for t in lay.tensors:
        assert struct.unpack_from("<I", data, t.n_dims_pos)[0] == len(t.shape)
        assert struct.unpack_from("<Q", data, t.offset_pos)[0] == t.offset
    assert lay.table_end <= lay.data_offset <= lay.head_len


def test_mutations_are_reproducible_and_aimed_everywhere(tiny: Path) -> None:
    lay = read_layout(tiny)
    muts = [mutation(lay, 34, i) for i in range(400)]
    assert muts == [mutation(lay, 34, i) for i in range(400)]
    assert muts != [mutation(lay, 35, i) for i in range(400)]
    kinds = {m.kind for m in muts}
    for expected in ("header.n_kv", "kv.key_len", "kv.array_count", "kv.string_len", "kv.value_type",
                     "tensor.n_dims", "tensor.dim", "tensor.type", "tensor.offset.overlapping",
                     "tensor.offset.misaligned", "blind.truncate.tensor_table", "blind.bit_flips"):
        assert expected in kinds, sorted(kinds)
    assert all(p + len(b) <= lay.head_len for m in muts for p, b in m.patches)


def test_mutant_file_restores_the_original_after_each_case(tiny: Path, tmp_path: Path) -> None:
    lay = read_layout(tiny)
    files = MutantFile(tiny, tmp_path, lay)
    digest = hashlib.sha256(tiny.read_bytes()).hexdigest()
    for i in range(60):
        m = mutation(lay, 1, i)
        path = files.write(m)
        if m.truncate_at is not None:
            assert path.stat().st_size == m.truncate_at
        else:
            pos, new = m.patches[-1]
            assert path.read_bytes()[pos : pos + len(new)] == new
        files.restore()
        assert hashlib.sha256(files.full.read_bytes()).hexdigest() == digest


def test_a_campaign_on_a_tiny_model_passes(tiny: Path, tmp_path: Path) -> None:
    report = run_campaign(tiny, tmp_path, cases=200, seed=34, inspect_every=10)
    assert report.cases == 200 and not report.failures, report.summary()
    assert report.outcomes["rejected"] > 100 and report.outcomes["accepted"] > 0
    assert report.inspected >= 20
    assert "rejected by reason" in report.summary()


# Fake validators the child imports by name (--target), each with one planted bug.
def crashes_on_truncation(path: Path) -> Any:
    if path.name == "mutant-cut.gguf":
        raise KeyError("planted")
    return validate_gguf(path)


def hangs_on_case_3(path: Path) -> Any:
    hangs_on_case_3.calls = getattr(hangs_on_case_3, "calls", 0) + 1  # type: ignore[attr-defined]
    if hangs_on_case_3.calls == 4:  # type: ignore[attr-defined]
        time.sleep(60)
    return validate_gguf(path)


def two_line_reasons(path: Path) -> Any:
    try:
        return validate_gguf(path)
    except InvalidGGUF as exc:
        raise InvalidGGUF(str(path), exc.reason + "\nsecond line") from None


def test_campaign_reports_a_crash_with_its_seed_case_and_mutation(tiny: Path, tmp_path: Path) -> None:
    report = run_campaign(tiny, tmp_path, cases=80, seed=34, inspect_every=0,
                          target=f"{HERE}:crashes_on_truncation")
    crashes = [f for f in report.failures if f.startswith("CRASH")]
    assert crashes and report.outcomes["crash"] == len(crashes)
    assert "seed 34 case" in crashes[0] and "blind.truncate" in crashes[0]
    assert "KeyError: 'planted'" in crashes[0]


def test_campaign_reports_a_hang_and_kills_it(tiny: Path, tmp_path: Path) -> None:
    t0 = time.perf_counter()
    report = run_campaign(tiny, tmp_path, cases=20, seed=34, inspect_every=0, hang_s=2,
                          target=f"{HERE}:hangs_on_case_3")
    assert time.perf_counter() - t0 < 40  # the fake sleeps 60 s: the watchdog cut it at 4
    assert report.cases == 3
    assert report.failures == ["HANG seed 34 case 3: no answer within 4 s (child killed)"]


def test_campaign_reports_a_reason_that_is_not_one_line(tiny: Path, tmp_path: Path) -> None:
    report = run_campaign(tiny, tmp_path, cases=20, seed=34, inspect_every=0,
                          target=f"{HERE}:two_line_reasons")
    assert report.failures and all("not name the file on one printable line" in f for f in report.failures)


def test_inspect_problem_holds_the_cli_to_its_documented_exits(tiny: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny.read_bytes()[:100])
    assert inspect_problem(tiny, True, ["--json"]) is None
    assert inspect_problem(broken, False, []) is None
    assert "on an accepted file" in str(inspect_problem(broken, True, []))
    assert "on a rejected file" in str(inspect_problem(tiny, False, []))


def test_reason_classes_drop_numbers_and_names() -> None:
    reason = "tensor 'blk.3.x' has n_dims 7, outside 1..4"
    assert reason_class(reason) == "tensor '…' has n_dims N, outside N..N"
