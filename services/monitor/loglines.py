"""Turning Docker's log stream into lines, and knowing where a shipper left off.

No IO here. Docker sends arbitrary chunks of `<RFC3339Nano timestamp> <text>\\n`
(one timestamp per log message, `timestamps=True`); these functions cut them
into lines, cap each one, and keep the cursor that makes a restarted shipper
skip exactly what was already shipped.

The cursor is (the newest Docker timestamp shipped, how many lines were
shipped with exactly that timestamp). A resumed stream asks Docker for the log
`since` that very nanosecond (the engine takes `<seconds>.<nanoseconds>`),
which is inclusive, so it repeats the lines stamped with it (and an engine
that does not filter every line by time may send older ones): lines older than
the cursor are dropped, then the first `count` lines carrying its timestamp,
and from the first line past it everything is new. A line older than the
cursor that was not shipped (stdout and stderr are stamped apart) is lost on a
resume, now as with the whole-second `since` before. Counting equal timestamps
matters because one burst of output can stamp several lines with the same
nanosecond on a coarse clock.
"""

from __future__ import annotations

import calendar
import codecs
import functools
import itertools
import operator
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

# A line longer than this is cut (the rest of it is dropped), as Docker's own
# json-file driver splits messages at 16 KiB.
MAX_LINE_BYTES = 16 * 1024
# Room for the timestamp Docker puts before each line, on top of the cap.
_TIMESTAMP_ROOM = 64
RAW_LINE_LIMIT = MAX_LINE_BYTES + _TIMESTAMP_ROOM

NANOS_PER_SECOND = 1_000_000_000

_TIMESTAMP = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")
_SECOND_DIGITS = 19  # "2026-11-22T07:36:15"
_MAX_FRACTION_DIGITS = 9


def parse_docker_timestamp(text: str) -> int | None:
    """Nanoseconds since the epoch of an RFC 3339 timestamp; None if it is not one.

    Docker stamps in UTC ("...Z"), and a burst of output shares its second:
    that second is parsed once (`_utc_second`), the fraction per line.
    """
    if len(text) > _SECOND_DIGITS and text[-1] == "Z":
        fraction = text[_SECOND_DIGITS + 1:-1]
        separator = text[_SECOND_DIGITS]
        if (separator == "Z" and len(text) == _SECOND_DIGITS + 1) or (
                separator == "." and 0 < len(fraction) <= _MAX_FRACTION_DIGITS
                and fraction.isascii() and fraction.isdigit()):
            seconds = _utc_second(text[:_SECOND_DIGITS])
            if seconds is not None:
                return seconds * NANOS_PER_SECOND + int(fraction.ljust(9, "0") or "0")
    return _parse_rfc3339(text)


@functools.lru_cache(maxsize=256)
def _utc_second(text: str) -> int | None:
    """Seconds since the epoch of "YYYY-MM-DDTHH:MM:SS" in UTC."""
    stamp = _parse_rfc3339(text + "Z")
    return None if stamp is None else stamp // NANOS_PER_SECOND


def _parse_rfc3339(text: str) -> int | None:
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    fraction, zone = match.group(7) or "", match.group(8)
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * NANOS_PER_SECOND + int(fraction.ljust(9, "0") or "0")


def split_timestamp(raw: bytes) -> tuple[int | None, bytes]:
    """(timestamp ns, message) of one raw line; (None, raw) when it carries none."""
    space = raw.find(b" ", 0, _TIMESTAMP_ROOM)
    if space <= 0:
        return None, raw
    stamp = parse_docker_timestamp(raw[:space].decode("ascii", "replace"))
    if stamp is None:
        return None, raw
    return stamp, raw[space + 1:]


_WITHOUT_ZONE = operator.itemgetter(slice(None, -1))
_ZONE_SUFFIX = "Z"
# "YYYY-MM-DDTHH:MM:SSZ" to "YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ".
_UTC_STAMP_CHARS = (_SECOND_DIGITS + 1, _SECOND_DIGITS + 2 + _MAX_FRACTION_DIGITS)


class StampedLines:
    """One read's lines as the shipper takes them from either source: the
    text a user sees of each, and the engine's stamp of each (ns; None
    where a line bore none).

    From a follow the stamps come parsed (`of_follow`). From the engine's
    json-file they come as its RFC 3339 texts (`of_utc_times`), parsed only
    if a resumed read needs each line's: what the cursor needs, the newest
    stamp and how many lines bear it, is found among the texts themselves.
    The engine writes them in UTC with the fraction's trailing zeros cut
    ("...:15.1Z"), so that, without the "Z", one sorts before another as
    their instants do, and equal instants are equal texts.
    """

    __slots__ = ("_stamps", "_times", "texts")

    def __init__(self, texts: list[str], stamps: list[int | None] | None = None,
                 times: list[str] | None = None) -> None:
        self.texts = texts
        self._stamps, self._times = stamps, times

    @classmethod
    def of_follow(cls, raws: Iterable[bytes]) -> StampedLines:
        """A follow's raw lines, `<timestamp> <text>` each."""
        stamps: list[int | None] = []
        texts: list[str] = []
        for raw in raws:
            stamp, message = split_timestamp(raw)
            stamps.append(stamp)
            texts.append(render_line(message))
        return cls(texts, stamps=stamps)

    @classmethod
    def of_utc_times(cls, texts: list[str], times: list[str]) -> StampedLines:
        """Texts with the engine's stamps of them as written in its json-file;
        stamps of any other form are parsed at once."""
        if times and all(map(str.endswith, times, itertools.repeat(_ZONE_SUFFIX))) \
                and _UTC_STAMP_CHARS[0] <= min(map(len, times)) \
                and max(map(len, times)) <= _UTC_STAMP_CHARS[1]:
            return cls(texts, times=times)
        return cls(texts, stamps=[parse_docker_timestamp(time) for time in times])

    def __len__(self) -> int:
        return len(self.texts)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StampedLines) and self.pairs() == other.pairs()

    def __repr__(self) -> str:
        return f"StampedLines({self.pairs()!r})"

    def stamps(self) -> list[int | None]:
        """Each line's stamp."""
        if self._stamps is None:
            self._stamps = [parse_docker_timestamp(time) for time in self._times or ()]
        return self._stamps

    def pairs(self) -> list[tuple[int | None, str]]:
        return list(zip(self.stamps(), self.texts, strict=True))

    def newest(self) -> tuple[int, int] | None:
        """The newest stamp and how many lines bear it; None if none has one."""
        if self._times is not None:
            keys = list(map(_WITHOUT_ZONE, self._times))
            top = max(keys)
            stamp = parse_docker_timestamp(top + _ZONE_SUFFIX)
            if stamp is not None:
                return stamp, keys.count(top)
        stamps = [stamp for stamp in self.stamps() if stamp is not None]
        if not stamps:
            return None
        top_stamp = max(stamps)
        return top_stamp, stamps.count(top_stamp)

    def without(self, replay: ReplayFilter) -> StampedLines:
        """The lines a resumed read's replay filter does not skip."""
        if replay.passed:
            return self
        kept = [(stamp, text) for stamp, text in zip(self.stamps(), self.texts, strict=True)
                if not replay.skips(stamp)]
        return StampedLines([text for _stamp, text in kept],
                            stamps=[stamp for stamp, _text in kept])


def render_line(message: bytes, max_bytes: int = MAX_LINE_BYTES) -> str:
    """The text a user sees: `\\r\\n` endings dropped, capped, invalid UTF-8 replaced.

    A cap that falls inside a multi-byte character drops that character
    rather than showing half of it.
    """
    if message.endswith(b"\r"):
        message = message[:-1]
    if len(message) <= max_bytes:
        return message.decode("utf-8", "replace")
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    return decoder.decode(message[:max_bytes], final=False)


def render_text(text: str, max_bytes: int = MAX_LINE_BYTES) -> str:
    """`render_line` of a line already decoded (a json-file entry's text
    without its newline); a lone surrogate (which no UTF-8 encodes) is replaced."""
    if text.endswith("\r"):
        text = text[:-1]
    data = text.encode("utf-8", "replace")
    return render_line(data, max_bytes) if len(data) > max_bytes else data.decode("utf-8")


# A multiplexed log frame: stream number (0-3: stdin, stdout, stderr, the
# engine's own errors, as "Error grabbing logs"), three zero bytes, length
# (4 bytes).
FRAME_HEADER_BYTES = 8
LAST_STREAM_NUMBER = 3
_FRAME_LENGTH = struct.Struct(">I")  # the header's last four bytes


class FrameSplitter:
    """The payload of Docker's multiplexed stream (a container without a
    TTY: stdout and stderr as frames, each a header and its bytes), from
    chunks cut anywhere, headers and payloads included. stdout and stderr
    come out as one stream, in the engine's order."""

    def __init__(self) -> None:
        self._header = b""  # the start of a header the last chunk cut
        self._left = 0  # payload bytes of the current frame still to come

    @property
    def pending(self) -> bool:
        """Inside a frame: a stream that ends here was cut, not finished."""
        return bool(self._header) or self._left > 0

    def feed(self, chunk: bytes) -> bytes:
        if self._header:
            chunk, self._header = self._header + chunk, b""
        out: list[bytes] = []
        at, size, left = 0, len(chunk), self._left
        while at < size:
            if left:
                end = min(at + left, size)
                out.append(chunk[at:end])
                left -= end - at
                at = end
            elif size - at < FRAME_HEADER_BYTES:
                self._header = chunk[at:]
                break
            else:
                (left,) = _FRAME_LENGTH.unpack_from(chunk, at + 4)
                at += FRAME_HEADER_BYTES
        self._left = left
        return b"".join(out)


class LineSplitter:
    """Cuts a byte stream into lines across chunk boundaries.

    A line longer than `limit` bytes keeps its first `limit` bytes; the rest
    is dropped as it arrives, so a process that never prints a newline cannot
    grow the buffer without bound.
    """

    def __init__(self, limit: int = RAW_LINE_LIMIT) -> None:
        self._limit = limit
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        *lines, rest = chunk.split(b"\n")
        if lines:  # the first completes what earlier chunks began
            self._keep(lines[0])
            lines[0] = bytes(self._buffer)
            self._buffer.clear()
            limit = self._limit
            lines = [line if len(line) <= limit else line[:limit] for line in lines]
        self._keep(rest)
        return lines

    def finish(self) -> list[bytes]:
        """The last line when the stream ended without a newline."""
        if not self._buffer:
            return []
        line = bytes(self._buffer)
        self._buffer.clear()
        return [line]

    def _keep(self, piece: bytes) -> None:
        room = self._limit - len(self._buffer)
        if room > 0 and piece:
            self._buffer += piece[:room]


@dataclass(frozen=True)
class LogCursor:
    """Where shipping got to: the newest timestamp shipped and how many lines bore it."""

    ts_ns: int
    count: int = 1

    def encode(self) -> str:
        return f"{self.ts_ns}:{self.count}"

    @classmethod
    def decode(cls, text: str | None) -> LogCursor | None:
        if not text:
            return None
        stamp, _, count = text.partition(":")
        try:
            cursor = cls(int(stamp), int(count or "1"))
        except ValueError:
            return None
        return cursor if cursor.ts_ns > 0 and cursor.count > 0 else None

    @property
    def since(self) -> str | None:
        """Docker's `since` for a resumed stream: this very nanosecond,
        inclusive, so the stream starts at the cursor's own lines rather than
        at the start of its second (a busy second can hold 100,000 lines)."""
        seconds, nanos = divmod(self.ts_ns, NANOS_PER_SECOND)
        return f"{seconds}.{nanos:09d}" if seconds > 0 else None


def advance(cursor: LogCursor | None, ts_ns: int) -> LogCursor:
    """The cursor after shipping a line stamped `ts_ns`.

    A line older than the cursor (stdout and stderr are stamped by separate
    copiers, so the log can be slightly out of order) leaves it unchanged: the
    cursor only ever moves forward, so a resumed stream never repeats a line
    shipped after it.
    """
    moved = advance_all(cursor, (ts_ns,))
    assert moved is not None  # one stamp given
    return moved


def advance_to_newest(cursor: LogCursor | None,
                      newest: tuple[int, int] | None) -> LogCursor | None:
    """`advance_all` over a read's stamps, from the newest of them and how
    many lines bear it (`StampedLines.newest`)."""
    if newest is None:
        return cursor
    stamp, count = newest
    if cursor is None or stamp > cursor.ts_ns:
        return LogCursor(stamp, count)
    if stamp == cursor.ts_ns:
        return LogCursor(stamp, cursor.count + count)
    return cursor


def advance_all(cursor: LogCursor | None, stamps: Iterable[int]) -> LogCursor | None:
    """`advance` over each of `stamps` in turn, one cursor made at the end
    (a read of 100,000 lines made 100,000 cursors); `cursor` itself when no
    stamp moved it."""
    ts_ns, count = (cursor.ts_ns, cursor.count) if cursor is not None else (-1, 0)
    moved = False
    for stamp in stamps:
        if stamp > ts_ns:
            ts_ns, count, moved = stamp, 1, True
        elif stamp == ts_ns:
            count, moved = count + 1, True
    return LogCursor(ts_ns, count) if moved else cursor


class ReplayFilter:
    """Drops the lines a resumed stream repeats, up to and including the cursor."""

    def __init__(self, cursor: LogCursor | None) -> None:
        self._cursor = cursor
        self._equal_seen = 0
        self._passed = cursor is None

    @property
    def passed(self) -> bool:
        """Past the cursor: nothing more is skipped."""
        return self._passed

    def skips(self, ts_ns: int | None) -> bool:
        if self._passed or ts_ns is None or self._cursor is None:
            return False
        if ts_ns < self._cursor.ts_ns:
            return True
        if ts_ns == self._cursor.ts_ns and self._equal_seen < self._cursor.count:
            self._equal_seen += 1
            return True
        self._passed = True
        return False
