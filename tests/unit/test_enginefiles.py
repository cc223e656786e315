"""Reading an engine's json-file log (services/monitor/enginefiles.py) from
real files: stamped lines as a follow gives them, complete lines only, a line
the engine cut into parts joined, to the container's end, across a rotation,
woken at once by an exit."""

from __future__ import annotations

import json
import os
import queue
import select
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.monitor.enginefiles import (
    AUTO,
    OFF,
    READ_BYTES,
    EntryLines,
    JsonFileLog,
    _Inotify,
    engine_folder,
)
from services.monitor.loglines import (
    MAX_LINE_BYTES,
    StampedLines,
    parse_docker_timestamp,
)

Line = tuple[int | None, str]

WAIT_SECONDS = 10.0
STAMP = "2026-11-29T06:00:00.{:09d}Z"


def entry(n: int, text: str | None = None, stream: str = "stdout") -> bytes:
    line = f"{n}\n" if text is None else text
    return json.dumps({"log": line, "stream": stream, "time": STAMP.format(n)}).encode() + b"\n"


def stamp(n: int) -> int | None:
    return parse_docker_timestamp(STAMP.format(n))


def line_of(n: int, text: str | None = None) -> Line:
    return stamp(n), str(n) if text is None else text


def lines_of(*numbers: int) -> list[Line]:
    return [line_of(n) for n in numbers]


def read_all(log: JsonFileLog) -> list[Line]:
    return [line for lines in log for line in lines.pairs()]


@pytest.mark.parametrize("text", [
    "plain ascii\n", "é ünïcode\n", "a crlf\r\n", "ends in \\\n", "", "\n", "tab\tand \x1b[0m\n",
    "x" * (MAX_LINE_BYTES // 4) + "\n", "x" * (MAX_LINE_BYTES + 10) + "\n",
    "é" * MAX_LINE_BYTES + "\n",
])
def test_an_entry_is_the_line_a_follow_with_timestamps_gives(text: str) -> None:
    """The same stamp and text as the engine's follow: `<time> <log>`, cut
    and rendered by the follow's own path (loglines)."""
    follow = f"{STAMP.format(7)} {text}".encode()
    expected = StampedLines.of_follow(follow.split(b"\n")[:1] if text.endswith("\n") else [])
    assert EntryLines().feed(entry(7, text)) == expected


def test_a_line_the_engine_cut_into_parts_is_one_line_stamped_with_its_first() -> None:
    lines = EntryLines()
    assert lines.feed(entry(1, "x" * 16384) + entry(2, "y" * 16384)).pairs() == []
    assert lines.feed(entry(3, "tail\n") + entry(4)).pairs() == [
        line_of(1, "x" * 16384), line_of(4)]  # capped at 16 KiB, as a follow's line is


def test_a_log_ending_inside_a_cut_line_gives_that_line_at_its_finish() -> None:
    lines = EntryLines()
    assert lines.feed(entry(1) + entry(2, "no newline")).pairs() == lines_of(1)
    assert lines.finish().pairs() == [line_of(2, "no newline")]
    assert lines.finish().pairs() == []


def test_a_line_that_never_ends_is_held_to_the_cap_only() -> None:
    lines = EntryLines()
    for n in range(100):
        assert lines.feed(entry(n, "z" * 16384)).pairs() == []
    assert lines.finish().pairs() == [line_of(0, "z" * MAX_LINE_BYTES)]


def test_a_lone_surrogate_is_replaced_so_the_line_can_be_encoded() -> None:
    data = entry(1, "bad \ud800 half\n")  # json.dumps escapes it as \\ud800
    [(_stamp, text)] = EntryLines().feed(data).pairs()
    assert text == "bad ? half"
    text.encode("utf-8")


def test_a_read_with_a_lone_surrogate_among_its_entries_keeps_them_all() -> None:
    """orjson refuses the escape of a lone surrogate; the read is then taken
    by json, whole, with the same lines as any other read."""
    data = entry(1) + entry(2, "bad \ud800 half\n") + entry(3, "é\n")
    assert EntryLines().feed(data).pairs() == [line_of(1), (stamp(2), "bad ? half"),
                                               line_of(3, "é")]


def test_a_torn_line_is_skipped_and_the_rest_kept() -> None:
    data = entry(1) + b'{"log":"half of an ent\n' + entry(2) + b'[1, 2]\n"text"\n{"log": 5}\n'
    assert EntryLines().feed(data).pairs() == lines_of(1, 2)


def test_a_log_is_read_to_its_end_once_the_container_exited(tmp_path: Path) -> None:
    path = tmp_path / "c-json.log"
    path.write_bytes(b"".join(entry(n) for n in range(1, 1001)))
    exited = threading.Event()
    exited.set()
    log = JsonFileLog(str(path), exited)
    assert read_all(log) == lines_of(*range(1, 1001))
    assert log.ended


def test_a_line_the_engine_is_still_writing_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "c-json.log"
    whole = entry(2)
    path.write_bytes(entry(1) + whole[:10])
    exited = threading.Event()
    log = JsonFileLog(str(path), exited)
    chunks = _reader(log)
    assert pairs(chunks.get(timeout=WAIT_SECONDS)) == lines_of(1)
    with path.open("ab") as file:
        file.write(whole[10:])
    assert pairs(chunks.get(timeout=WAIT_SECONDS)) == lines_of(2)
    exited.set()
    log.wake()
    assert chunks.get(timeout=WAIT_SECONDS) is None
    assert log.ended


def test_a_rotated_log_is_read_to_its_end_then_the_new_file_from_its_start(
        tmp_path: Path) -> None:
    path = tmp_path / "c-json.log"
    path.write_bytes(entry(1) + entry(2) + entry(3))
    exited = threading.Event()
    log = JsonFileLog(str(path), exited)  # holds the file that is about to be rotated
    os.rename(path, tmp_path / "c-json.log.1")
    path.write_bytes(entry(4))
    exited.set()
    assert read_all(log) == lines_of(1, 2, 3, 4)
    assert log.ended


def test_a_log_moved_away_with_nothing_in_its_place_stops_without_having_ended(
        tmp_path: Path) -> None:
    """A rotation caught half done, or a removed container: the shipper asks
    the engine whether the container still runs, and reads again."""
    path = tmp_path / "c-json.log"
    path.write_bytes(entry(1))
    log = JsonFileLog(str(path), threading.Event())
    chunks = _reader(log)
    assert pairs(chunks.get(timeout=WAIT_SECONDS)) == lines_of(1)
    with path.open("ab") as file:
        file.write(entry(2))
    path.unlink()
    got = []
    while (chunk := chunks.get(timeout=WAIT_SECONDS)) is not None:
        got += chunk.pairs()
    assert got == lines_of(2)  # in the file it held, read before it stopped
    assert not log.ended


def test_a_closed_log_stops_without_having_ended(tmp_path: Path) -> None:
    path = tmp_path / "c-json.log"
    path.write_bytes(entry(1))
    log = JsonFileLog(str(path), threading.Event())
    chunks = _reader(log)
    assert pairs(chunks.get(timeout=WAIT_SECONDS)) == lines_of(1)
    log.close()
    assert chunks.get(timeout=WAIT_SECONDS) is None
    assert not log.ended


def test_a_log_that_ended_leaves_its_inotify_to_the_next_which_sees_its_own_file(
        tmp_path: Path) -> None:
    """Closing an inotify instance waits for the kernel's grace period, on
    the way from a container's exit to its exit recorded: it is reused."""
    first, second = tmp_path / "a-json.log", tmp_path / "b-json.log"
    first.write_bytes(entry(1))
    second.write_bytes(entry(2))
    done = threading.Event()
    done.set()
    ended = JsonFileLog(str(first), done)
    notify = ended._notify
    assert read_all(ended) == lines_of(1)
    exited = threading.Event()
    log = JsonFileLog(str(second), exited)
    assert log._notify is notify
    chunks = _reader(log)
    assert pairs(chunks.get(timeout=WAIT_SECONDS)) == lines_of(2)
    with second.open("ab") as file:  # seen by inotify: the reader waits with no timeout
        file.write(entry(3))
    assert pairs(chunks.get(timeout=WAIT_SECONDS)) == lines_of(3)
    exited.set()
    log.wake()
    assert chunks.get(timeout=WAIT_SECONDS) is None


def test_a_released_inotify_watches_nothing_and_is_kept_once(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.touch()
    new.touch()
    notify = _Inotify.take()
    notify.watch(str(old))
    notify.release()
    notify.release()  # a second release must not hand it to two logs
    assert _Inotify._idle.count(notify) == 1
    assert _Inotify.take() is notify
    notify.watch(str(new))
    poller = select.poll()
    poller.register(notify._fd, select.POLLIN)
    old.write_bytes(b"x")
    assert poller.poll(0) == []  # the old file's watch went with its log
    new.write_bytes(b"x")
    assert poller.poll(0) != []
    notify.release()


def test_a_resumed_read_passes_over_what_is_older_than_its_cursor(tmp_path: Path) -> None:
    """Whole reads before the cursor are not parsed; from the read that
    reaches it on, every entry comes (the replay filter drops the rest)."""
    path = tmp_path / "c-json.log"
    padding = "x" * 200
    count = 3 * READ_BYTES // len(entry(0, padding + "\n"))  # about three reads' worth
    path.write_bytes(b"".join(entry(n, f"{padding} {n}\n") for n in range(1, count + 1)))
    cursor = count - 10
    exited = threading.Event()
    exited.set()
    cursor_ns = parse_docker_timestamp(STAMP.format(cursor))
    out = read_all(JsonFileLog(str(path), exited, skip_before_ns=cursor_ns))
    stamps = [int(text.rsplit(" ", 1)[1]) for _stamp, text in out]
    assert stamps[-11:] == list(range(cursor, count + 1))
    assert stamps == list(range(stamps[0], count + 1))
    assert 1 < stamps[0] <= cursor  # the reads before the cursor's were passed over


def test_a_missing_file_is_an_oserror_for_the_caller(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        JsonFileLog(str(tmp_path / "absent-json.log"), threading.Event())


@pytest.mark.parametrize(("info", "setting", "folder"), [
    ({"LoggingDriver": "json-file", "DockerRootDir": "/var/lib/docker"}, AUTO,
     "/var/lib/docker/containers"),
    ({"LoggingDriver": "json-file", "DockerRootDir": "/var/lib/docker"}, "/host/containers",
     "/host/containers"),
    ({"LoggingDriver": "json-file", "DockerRootDir": "/var/lib/docker"}, OFF, None),
    ({"LoggingDriver": "journald", "DockerRootDir": "/var/lib/docker"}, AUTO, None),
    ({"LoggingDriver": "local", "DockerRootDir": "/var/lib/docker"}, "/host/containers", None),
    ({"LoggingDriver": "json-file"}, AUTO, None),
    ({"LoggingDriver": "json-file", "DockerRootDir": "relative"}, AUTO, None),
])
def test_where_the_engines_log_files_are(info: dict[str, str], setting: str,
                                         folder: str | None) -> None:
    assert engine_folder(info, setting) == folder


def pairs(lines: StampedLines | None) -> list[Line] | None:
    return None if lines is None else lines.pairs()


def _reader(log: JsonFileLog) -> queue.Queue[StampedLines | None]:
    """Each read's lines the log yields, then None when it stops (a daemon thread)."""
    chunks: queue.Queue[StampedLines | None] = queue.Queue()

    def read(stream: Iterator[StampedLines]) -> None:
        try:
            for chunk in stream:
                chunks.put(chunk)
        finally:
            chunks.put(None)

    threading.Thread(target=read, args=(iter(log),), daemon=True).start()
    return chunks
