"""Walking GGUF string arrays (vocabularies, merges): where they end, and that no token repeats.

The hot part of checking a model file: a vocabulary has 49k-262k strings, each a u64 length and
its bytes, so where one ends is known only from the one before. `skip_strings` and
`walk_unique_strings` take a fast loop first and check the result as a whole; anything that does
not pass is walked element by element, which says which element is at fault.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edge.gguf.reader import _Cursor as Cursor

_U64 = struct.Struct("<Q")


def skip_strings(cur: Cursor, count: int, key: str) -> None:
    """Walk `count` strings without decoding them (hot loop: 262k-entry vocabularies). A well-formed
    array takes the fast loop; anything else is walked again, checking each element, for the
    reason that names it."""
    end = _fast_end(cur, count)
    if end is None:
        for _ in _checked_elements(cur, count, key):
            pass
        return
    cur.pos = end


def walk_unique_strings(cur: Cursor, count: int, key: str) -> None:
    """`skip_strings`, and no token repeats as llama.cpp reads it: up to its first NUL (a C
    string), an empty one renamed "[EMPTY_i]". Its loader GGML_ASSERTs, killing the process, on a
    repeat. A vocabulary of distinct tokens with no NUL (at most one of them empty) is told by
    whole-list checks in C (a set, one join); any other is walked token by token, which accepts
    or names the first repeat."""
    texts: list[bytes] = []
    end = _fast_end(cur, count, texts)
    if end is not None and len(set(texts)) == count and 0 not in b"".join(texts):
        cur.pos = end
        return
    seen: set[bytes] = set()
    for i, start, text in _checked_elements(cur, count, key):
        if 0 in text:
            text = text[: text.index(0)]
        if text in seen:
            raise cur.fail(f"element {i} of array '{key}' repeats an earlier entry {text!r:.60}", start)
        if text:
            seen.add(text)


def _fast_end(cur: Cursor, count: int, texts: list[bytes] | None = None) -> int | None:
    """Where `count` length-prefixed strings from `cur.pos` end, by the shortest loop (a third of
    the per-element checks' time); None when they do not fit before `cur.end`, for the checked
    walk to say where. `texts` collects each string's bytes."""
    buf, pos, unpack = cur.buf, cur.pos, _U64.unpack_from
    try:
        if texts is None:
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
        else:
            append = texts.append
            for _ in range(count):
                start = pos + 8
                pos = start + unpack(buf, pos)[0]
                append(buf[start:pos])
    except (struct.error, OverflowError):  # a length ran past the buffer (or past any offset)
        return None
    return pos if pos <= cur.end else None


def _checked_elements(cur: Cursor, count: int, key: str) -> Iterator[tuple[int, int, bytes]]:
    """(index, offset, bytes) of each of `count` strings from `cur.pos`, every length checked
    against the end of the file (InvalidGGUF names the first that does not fit); `cur.pos` ends
    after the last."""
    buf, pos, end, unpack = cur.buf, cur.pos, cur.end, _U64.unpack_from
    for i in range(count):
        if pos + 8 > end:
            cur.pos = pos
            cur.need(8, f"length of element {i} of array '{key}'")
        (n,) = unpack(buf, pos)
        if n > end - pos - 8:
            raise cur.fail(
                f"file truncated: element {i} of array '{key}' has length {n} "
                f"but only {end - pos - 8} bytes remain",
                pos,
            )
        yield i, pos, buf[pos + 8 : pos + 8 + n]
        pos += 8 + n
    cur.pos = pos
