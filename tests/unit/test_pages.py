"""Giving a model's weights back to the page cache: which mappings, and what madvise is asked."""

from __future__ import annotations

from pathlib import Path

from edge.runtime.llama import pages


def _maps(model: Path) -> str:
    return "\n".join([
        "55d0c0000000-55d0c0021000 r--p 00000000 08:01 131 /usr/bin/python3.11",
        f"7f0000000000-7f0000400000 r--s 00000000 08:01 77 {model}",
        f"7f0000500000-7f0000600000 r--s 00400000 08:01 77 {model}",
        "7f0000700000-7f0000800000 rw-p 00000000 00:00 0 ",
        f"7f0000900000-7f0000901000 r--s 00000000 08:01 78 {model}.other",
    ])


def test_every_mapping_of_the_file_and_nothing_else_is_given_back(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    maps = tmp_path / "maps"
    maps.write_text(_maps(model))
    asked: list[tuple[int, int, int]] = []

    def madvise(addr: int, length: int, advice: int) -> int:
        asked.append((addr, length, advice))
        return 0

    link = tmp_path / "link.gguf"
    link.symlink_to(model)  # the store may hand over another name for the same file
    assert pages.release(str(link), maps, madvise) == 0x400000 + 0x100000
    assert asked == [(0x7F0000000000, 0x400000, pages.MADV_DONTNEED),
                     (0x7F0000500000, 0x100000, pages.MADV_DONTNEED)]


def test_a_refusal_or_an_unreadable_map_gives_nothing_back(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    maps = tmp_path / "maps"
    maps.write_text(_maps(model))
    assert pages.release(str(model), maps, lambda *_a: -1) == 0
    assert pages.release(str(model), tmp_path / "missing", lambda *_a: 0) == 0
    assert pages.mapped_ranges(str(tmp_path / "not-mapped.gguf"), _maps(model)) == []
