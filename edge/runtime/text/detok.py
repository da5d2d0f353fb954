"""Incremental detokenization and stop-string matching across token boundaries.

Tokens are byte pieces; one UTF-8 character may span several tokens, and a stop
string may span several pieces. `TextStream` turns pieces into text that is
safe to send: never half a character, never any part of a stop string, and
never text that could still turn out to be the start of one (it is held back
until it cannot).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


class Utf8Stream:
    """Bytes in, complete characters out; an incomplete tail waits for the next piece."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        return self._dec.decode(piece)

    def flush(self) -> str:
        """End of stream: a dangling partial character becomes U+FFFD."""
        return self._dec.decode(b"", final=True)


def held_suffix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        upto = min(len(stop) - 1, len(text))
        for n in range(upto, best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best


@dataclass
class StopScan:
    emit: str  # text safe to send now
    stopped: bool  # a stop string was found; nothing after it is emitted


class StopMatcher:
    """Finds stop strings in a stream of text chunks without emitting any part of them."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._pending = ""

    def feed(self, chunk: str) -> StopScan:
        if not self.stops:
            return StopScan(chunk, False)
        text = self._pending + chunk
        cut = -1
        for stop in self.stops:
            i = text.find(stop)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
        if cut != -1:
            self._pending = ""
            return StopScan(text[:cut], True)
        hold = held_suffix_len(text, self.stops)
        self._pending = text[len(text) - hold :] if hold else ""
        return StopScan(text[: len(text) - hold], False)

    def flush(self) -> str:
        """End of stream without a stop: the held-back text was not a stop after all."""
        out, self._pending = self._pending, ""
        return out


class TextStream:
    """Pieces in, safe text out: UTF-8 completion first, then stop-string matching."""

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self._utf8 = Utf8Stream()
        self._stops = StopMatcher(stops)
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        scan = self._stops.feed(self._utf8.feed(piece))
        self.stopped = scan.stopped
        return scan.emit

    def finish(self) -> str:
        """Text still held back when generation ends for another reason (EOG, length).

        Bytes of a character the model never completed are dropped, not sent as U+FFFD."""
        if self.stopped:
            return ""
        return self._stops.flush()
