"""Cutting Docker's log stream into lines, and resuming it without repeats."""

from __future__ import annotations

import itertools
import time
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.monitor import loglines
from services.monitor.loglines import (
    MAX_LINE_BYTES,
    FrameSplitter,
    LineSplitter,
    LogCursor,
    ReplayFilter,
    StampedLines,
    advance,
    advance_all,
    advance_to_newest,
    parse_docker_timestamp,
    render_line,
    split_timestamp,
)
from services.monitor.logs import LogStream
from shared.node.engine import EngineCalls

# 2026-11-22T07:36:15Z
BASE = 1_795_332_975 * 1_000_000_000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2026-11-22T07:36:15.851784453Z", BASE + 851_784_453, id="docker nanos"),
        pytest.param("2026-11-22T07:36:15Z", BASE, id="no fraction"),
        pytest.param("2026-11-22T07:36:15.5Z", BASE + 500_000_000, id="short fraction"),
        pytest.param("2026-11-22T09:36:15.000000001+02:00", BASE + 1, id="positive offset"),
        pytest.param("2026-11-22T05:06:15-02:30", BASE, id="negative offset"),
        pytest.param("1970-01-01T00:00:00Z", 0, id="epoch"),
        pytest.param("2026-13-22T07:36:15Z", None, id="month 13"),
        pytest.param("2026-11-22 07:36:15Z", None, id="space instead of T"),
        pytest.param("2026-11-22T07:36:15.1234567890Z", None, id="ten fraction digits"),
        pytest.param("hello", None, id="not a timestamp"),
        pytest.param("", None, id="empty"),
    ],
)
def test_parse_docker_timestamp(text: str, expected: int | None) -> None:
    assert parse_docker_timestamp(text) == expected


@pytest.mark.parametrize(
    "text",
    ["2026-11-22T07:36:15.Z", "2026-11-22T07:36:15ZZ", "2026-11-22T07:36:15.12a4Z",
     "2026-11-22T07:36:15.1234567890Z", "2026-13-22T07:36:15.5Z"],
)
def test_fast_path_refuses_what_the_full_parse_refuses(text: str) -> None:
    assert parse_docker_timestamp(text) is None


@given(st.text(alphabet="0123456789-:.TZ+\u0661", min_size=19, max_size=32)
       | st.builds(lambda base, fraction, zone: base + fraction + zone,
                   st.sampled_from(["2026-11-22T07:36:15", "1999-12-31T23:59:60",
                                    "2026-02-30T00:00:00"]),
                   st.sampled_from(["", ".", ".5", ".000000001", ".1234567890", ".x"]),
                   st.sampled_from(["Z", "+02:00", "", "z"])))
def test_the_per_second_cache_agrees_with_the_full_parse(text: str) -> None:
    assert parse_docker_timestamp(text) == loglines._parse_rfc3339(text)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(b"2026-11-22T07:36:15.000000002Z hello world",
                     (BASE + 2, b"hello world"), id="stamped"),
        pytest.param(b"2026-11-22T07:36:15Z ", (BASE, b""), id="empty message"),
        pytest.param(b"2026-11-22T07:36:15Z  indented", (BASE, b" indented"),
                     id="leading space kept"),
        pytest.param(b"hello world", (None, b"hello world"), id="no stamp"),
        pytest.param(b"nospace", (None, b"nospace"), id="no space at all"),
        pytest.param(b" starts with space", (None, b" starts with space"), id="space first"),
    ],
)
def test_split_timestamp(raw: bytes, expected: tuple[int | None, bytes]) -> None:
    assert split_timestamp(raw) == expected


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(b"plain", "plain", id="plain"),
        pytest.param(b"windows\r", "windows", id="crlf ending dropped"),
        pytest.param(b"a\rb", "a\rb", id="inner carriage return kept"),
        pytest.param("héllo".encode(), "héllo", id="utf-8"),
        pytest.param(b"bad \xff byte", "bad \ufffd byte", id="invalid utf-8 replaced"),
    ],
)
def test_render_line(message: bytes, expected: str) -> None:
    assert render_line(message) == expected


def test_render_line_caps_at_16_kib() -> None:
    assert render_line(b"x" * (MAX_LINE_BYTES + 100)) == "x" * MAX_LINE_BYTES


def test_render_line_cap_never_splits_a_character() -> None:
    message = b"x" * (MAX_LINE_BYTES - 1) + "é".encode() + b"tail"
    assert render_line(message) == "x" * (MAX_LINE_BYTES - 1)


@pytest.mark.parametrize(
    ("chunks", "lines", "rest"),
    [
        pytest.param([b"a\nb\n"], [b"a", b"b"], [], id="two lines in one chunk"),
        pytest.param([b"hel", b"lo\nwor", b"ld\n"], [b"hello", b"world"], [],
                     id="lines across chunks"),
        pytest.param([b"a\n", b"\n", b"b"], [b"a", b""], [b"b"], id="empty line and a tail"),
        pytest.param([b"crlf\r\n"], [b"crlf\r"], [], id="crlf left to render_line"),
        pytest.param([b"", b"x", b""], [], [b"x"], id="empty chunks"),
        pytest.param([], [], [], id="nothing"),
    ],
)
def test_line_splitter(chunks: list[bytes], lines: list[bytes], rest: list[bytes]) -> None:
    splitter = LineSplitter()
    got = [line for chunk in chunks for line in splitter.feed(chunk)]
    assert got == lines
    assert splitter.finish() == rest
    assert splitter.finish() == []


def test_line_splitter_caps_a_long_line_and_recovers() -> None:
    splitter = LineSplitter(limit=10)
    got = splitter.feed(b"0123456789abc") + splitter.feed(b"def" * 1000) + splitter.feed(b"\nok\n")
    assert got == [b"0123456789", b"ok"]


def _frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_frame_splitter_joins_stdout_and_stderr_in_order() -> None:
    frames = FrameSplitter()
    data = _frame(1, b"out\n") + _frame(2, b"err\n") + _frame(1, b"") + _frame(1, b"more")
    assert frames.feed(data) == b"out\nerr\nmore"


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=40)), max_size=12),
       st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_frame_splitter_cut_anywhere(frames: list[tuple[int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(_frame(number, payload) for number, payload in frames)
    edges = [0, *sorted(min(cut, len(stream)) for cut in cuts), len(stream)]
    splitter = FrameSplitter()
    got = b"".join(splitter.feed(stream[a:b]) for a, b in itertools.pairwise(edges))
    assert got == b"".join(payload for _, payload in frames)


def test_line_splitter_one_byte_at_a_time() -> None:
    splitter = LineSplitter()
    data = b"first line\r\nsecond\nthird"
    got = [line for i in range(len(data)) for line in splitter.feed(data[i:i + 1])]
    assert got + splitter.finish() == [b"first line\r", b"second", b"third"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("123:4", LogCursor(123, 4), id="stamp and count"),
        pytest.param("123", LogCursor(123, 1), id="count defaults to one"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="missing"),
        pytest.param("x:1", None, id="garbage"),
        pytest.param("0:1", None, id="zero stamp"),
        pytest.param("5:0", None, id="zero count"),
    ],
)
def test_cursor_decode(text: str | None, expected: LogCursor | None) -> None:
    assert LogCursor.decode(text) == expected


def test_cursor_round_trip_and_since() -> None:
    cursor = LogCursor(BASE + 999_999_999, 3)
    assert LogCursor.decode(cursor.encode()) == cursor
    assert cursor.since == f"{BASE // 1_000_000_000}.999999999"
    assert LogCursor(BASE + 5, 1).since == f"{BASE // 1_000_000_000}.000000005"
    assert LogCursor(5, 1).since is None  # Docker refuses since=0


@pytest.mark.parametrize(
    ("cursor", "stamp", "expected"),
    [
        pytest.param(None, 10, LogCursor(10, 1), id="first line"),
        pytest.param(LogCursor(10, 1), 11, LogCursor(11, 1), id="newer line"),
        pytest.param(LogCursor(10, 2), 10, LogCursor(10, 3), id="same stamp counts"),
        pytest.param(LogCursor(10, 2), 9, LogCursor(10, 2), id="older line leaves it"),
    ],
)
def test_advance(cursor: LogCursor | None, stamp: int, expected: LogCursor) -> None:
    assert advance(cursor, stamp) == expected


@given(st.one_of(st.none(), st.builds(LogCursor, st.integers(0, 20), st.integers(1, 5))),
       st.lists(st.integers(0, 20), max_size=30))
def test_advancing_over_many_stamps_is_advancing_over_each(
        cursor: LogCursor | None, stamps: list[int]) -> None:
    expected = cursor
    for stamp in stamps:
        expected = advance(expected, stamp)
    assert advance_all(cursor, stamps) == expected


def go_rfc3339nano(ns: int) -> str:
    """A UTC instant as the engine writes it in its json-file (Go's
    RFC3339Nano: the fraction's trailing zeros cut, with its dot if all are)."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    fraction = f"{nanos:09d}".rstrip("0")
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) \
        + (f".{fraction}" if fraction else "") + "Z"


# Instants close together (one second of a busy log, its fractions of every
# length) and far apart.
_INSTANTS = st.one_of(st.integers(BASE, BASE + 2_000_000_000),
                      st.integers(BASE // 1000, BASE // 1000 + 10**6).map(lambda n: n * 1000),
                      st.integers(0, 4_102_444_800 * 10**9))


@given(st.lists(_INSTANTS, max_size=40))
def test_the_newest_of_the_engines_times_is_found_among_the_texts(stamps: list[int]) -> None:
    times = [go_rfc3339nano(stamp) for stamp in stamps]
    assert [parse_docker_timestamp(t) for t in times] == stamps
    lines = StampedLines.of_utc_times([str(n) for n in range(len(stamps))], times)
    expected = (max(stamps), stamps.count(max(stamps))) if stamps else None
    assert lines.newest() == expected
    assert lines.stamps() == stamps


def test_times_of_another_form_are_parsed_at_once() -> None:
    lines = StampedLines.of_utc_times(["a", "b", "c"], [
        "2026-11-22T09:36:15.000000001+02:00", "2026-11-22T07:36:15Z", "not a time"])
    assert lines.pairs() == [(BASE + 1, "a"), (BASE, "b"), (None, "c")]
    assert lines.newest() == (BASE + 1, 1)


@given(st.one_of(st.none(), st.builds(LogCursor, st.integers(0, 20), st.integers(1, 5))),
       st.lists(st.one_of(st.none(), st.integers(0, 20)), max_size=30))
def test_advancing_to_a_reads_newest_is_advancing_over_each_of_its_stamps(
        cursor: LogCursor | None, stamps: list[int | None]) -> None:
    lines = StampedLines([str(n) for n in range(len(stamps))], stamps=stamps)
    assert advance_to_newest(cursor, lines.newest()) == advance_all(
        cursor, [stamp for stamp in stamps if stamp is not None])


@given(st.one_of(st.none(), st.builds(LogCursor, st.integers(0, 20), st.integers(1, 5))),
       st.lists(st.one_of(st.none(), st.integers(0, 20)), max_size=30))
def test_a_reads_lines_without_a_replay_are_those_it_does_not_skip(
        cursor: LogCursor | None, stamps: list[int | None]) -> None:
    texts = [str(n) for n in range(len(stamps))]
    one_by_one = ReplayFilter(cursor)
    expected = [(stamp, text) for stamp, text in zip(stamps, texts, strict=True)
                if not one_by_one.skips(stamp)]
    assert StampedLines(texts, stamps=stamps).without(ReplayFilter(cursor)).pairs() == expected


def _ship(stamps: list[int], cursor: LogCursor | None) -> tuple[list[int], LogCursor | None]:
    """Indices of the lines a stream resumed at `cursor` ships, and the cursor after."""
    replay, shipped = ReplayFilter(cursor), []
    for i, stamp in enumerate(stamps):
        if not replay.skips(stamp):
            shipped.append(i)
            cursor = advance(cursor, stamp)
    return shipped, cursor


@pytest.mark.parametrize(
    ("stamps", "cut"),
    [
        pytest.param([1, 2, 3, 4, 5], 2, id="distinct stamps"),
        pytest.param([1, 2, 2, 2, 3], 2, id="cut inside equal stamps"),
        pytest.param([1, 2, 2, 2, 3], 4, id="cut after equal stamps"),
        pytest.param([5, 5, 5, 5], 1, id="every stamp equal"),
        pytest.param([1, 3, 2, 4], 3, id="out of order before the cut"),
        pytest.param([1, 2, 3], 0, id="nothing shipped yet"),
        pytest.param([1, 2, 3], 3, id="everything shipped"),
    ],
)
def test_resume_ships_each_line_once(stamps: list[int], cut: int) -> None:
    first, cursor = _ship(stamps[:cut], None)
    # Docker's `since` is inclusive and coarse: the resumed stream repeats
    # everything from the start here.
    second, _ = _ship(stamps, cursor)
    assert first + second == list(range(len(stamps)))


def test_resume_drops_rather_than_repeats_an_out_of_order_line_at_the_cut() -> None:
    # stdout and stderr are stamped apart, so a line may sit after a newer
    # one. Cut between them, the older line is indistinguishable from one
    # already shipped: it is dropped; nothing is ever shipped twice.
    stamps = [1, 3, 2, 4]
    first, cursor = _ship(stamps[:2], None)
    second, _ = _ship(stamps, cursor)
    assert (first, second) == ([0, 1], [3])


def test_replay_filter_ships_everything_after_the_resume_point() -> None:
    replay = ReplayFilter(LogCursor(10, 1))
    assert [replay.skips(s) for s in [9, 10, 11, 5, None]] == [True, True, False, False, False]


def test_replay_filter_without_cursor_skips_nothing() -> None:
    replay = ReplayFilter(None)
    assert not replay.skips(1)
    assert not replay.skips(None)


class _Response:
    """A log response's body as the engine sent it, then its end."""

    def __init__(self, body: bytes) -> None:
        self.body = body

    def read(self, amount: int) -> bytes:
        data, self.body = self.body[:amount], self.body[amount:]
        return data

    read1 = read

    def close(self) -> None:
        self.body = b""


class _Engine:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def follow_log(self, container_id: str, since: str | None = None) -> _Response:
        return _Response(self.body)


@pytest.mark.parametrize(
    ("body", "ended"),
    [
        pytest.param(_frame(1, b"a\n") + _frame(2, b"b\n"), True, id="at a frame's end"),
        pytest.param(_frame(1, b"a\n") + _frame(2, b"b\n")[:5], False, id="inside a header"),
        pytest.param(_frame(1, b"a\n") + _frame(2, b"bcd\n")[:10], False, id="inside a payload"),
        pytest.param(b"2026-11-22T07:36:15Z on a tty", True, id="a raw stream"),
    ],
)
def test_a_stream_that_stops_inside_a_frame_broke(body: bytes, ended: bool) -> None:
    stream = LogStream(cast(EngineCalls, _Engine(body)), "c", None)
    list(stream)
    assert stream.ended is ended
