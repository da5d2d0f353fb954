"""Request bodies from raw bytes to Python values, bounded before any recursive parse.

`json.loads` recurses once per nesting level: a 4 MiB body of `[[[[...` (or one nested
inside `metadata`) costs a RecursionError deep inside the parser, and pydantic recurses
again. So the nesting depth is measured first by a linear, non-recursive scan of the raw
bytes (brackets outside strings, escapes honoured), and a body deeper than
`MAX_JSON_DEPTH` is a 400 naming the limit. No OpenAI request needs more than about ten
levels; 64 leaves room for deep tool-parameter schemas.
"""

from __future__ import annotations

import array
import itertools
import json
import re
from typing import Any

from edge.errors import InvalidRequest

MAX_JSON_DEPTH = 64

# A JSON string: quote, then runs of plain characters or escape pairs, then quote (unrolled, so the
# regex engine does not backtrack per character). An unterminated string simply does not match.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_OPEN, _CLOSE = b"\x01", b"\xff"  # +1 and -1 as signed bytes
_BRACKETS = bytes.maketrans(b"[{]}", _OPEN * 2 + _CLOSE * 2)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[{]}")


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays and objects in `raw` (strings skipped); linear time, no recursion."""
    outside = _STRING.sub(b"", raw)
    steps = outside.translate(_BRACKETS, _NOT_BRACKETS)
    if not steps:
        return 0
    return max(0, max(itertools.accumulate(array.array("b", steps))))


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Decode a request body; InvalidRequest when it is not JSON or nests deeper than `max_depth`."""
    depth = json_depth(raw)
    if depth > max_depth:
        raise InvalidRequest(
            f"request body nests {depth} levels of arrays/objects; this server accepts at most {max_depth}")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
