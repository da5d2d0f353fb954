"""UTF-8 safe incremental detokenization and stop strings across token boundaries."""

from __future__ import annotations

from edge.runtime.text.detok import StopMatcher, TextStream, Utf8Stream, held_suffix_len


def test_utf8_multibyte_split_across_pieces_is_never_broken() -> None:
    data = "héllo 🙂 世界".encode()
    stream = Utf8Stream()
    out = [stream.feed(data[i : i + 1]) for i in range(len(data))]
    assert "".join(out) == "héllo 🙂 世界"
    assert all("\ufffd" not in piece for piece in out)
    emoji_at = data.index("🙂".encode())
    assert out[emoji_at : emoji_at + 3] == ["", "", ""]  # held until the 4th byte


def test_utf8_dangling_bytes_flush_as_replacement() -> None:
    stream = Utf8Stream()
    assert stream.feed(b"ok\xe4\xb8") == "ok"
    assert stream.flush() == "\ufffd"


def test_held_suffix_len() -> None:
    assert held_suffix_len("hello </", ("</s>",)) == 2
    assert held_suffix_len("hello", ("</s>",)) == 0
    assert held_suffix_len("ab", ("abc", "bx")) == 2


def test_stop_string_spanning_three_pieces_is_not_emitted() -> None:
    m = StopMatcher(("<END>",))
    emitted = []
    stopped = False
    for chunk in ["Hello <", "E", "ND> trailing"]:
        scan = m.feed(chunk)
        emitted.append(scan.emit)
        stopped = scan.stopped
        if stopped:
            break
    assert stopped
    assert "".join(emitted) == "Hello "
    assert emitted[0] == "Hello "  # '<' held back while it could start the stop string


def test_false_alarm_prefix_is_released() -> None:
    m = StopMatcher(("<END>",))
    assert m.feed("a <E").emit == "a "
    scan = m.feed("X")
    assert scan.emit == "<EX" and not scan.stopped


def test_earliest_of_several_stops_wins() -> None:
    m = StopMatcher(("world", "lo w"))
    scan = m.feed("hello world")
    assert scan.stopped and scan.emit == "hel"


def test_text_stream_combines_utf8_and_stops() -> None:
    ts = TextStream(("é!",))
    pieces = [b"caf", b"\xc3", b"\xa9", b"!", b"more"]
    out = [ts.feed(p) for p in pieces]
    assert "".join(out) == "caf" and ts.stopped
    assert ts.feed(b"x") == ""


def test_text_stream_finish_releases_held_text() -> None:
    ts = TextStream(("STOP",))
    assert ts.feed(b"abc ST") == "abc "
    assert ts.finish() == "ST"


def test_text_stream_finish_drops_an_unfinished_character() -> None:
    ts = TextStream()
    assert ts.feed("ok🙂".encode()[:4]) == "ok"
    assert ts.finish() == ""
