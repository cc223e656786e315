"""Reading an engine's json-file log (services/monitor/enginefiles.py) from
real files: what a follow with timestamps would send, complete lines only,
to the container's end, across a rotation, woken at once by an exit."""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.monitor.enginefiles import (
    AUTO,
    OFF,
    READ_BYTES,
    JsonFileLog,
    engine_folder,
    entries_as_follow,
)
from services.monitor.loglines import parse_docker_timestamp

WAIT_SECONDS = 10.0
STAMP = "2026-11-29T06:00:00.{:09d}Z"


def entry(n: int, text: str | None = None, stream: str = "stdout") -> bytes:
    line = f"{n}\n" if text is None else text
    return json.dumps({"log": line, "stream": stream, "time": STAMP.format(n)}).encode() + b"\n"


def follow_of(n: int) -> bytes:
    return f"{STAMP.format(n)} {n}\n".encode()


def read_all(log: JsonFileLog) -> bytes:
    return b"".join(log)


def test_entries_become_what_a_follow_with_timestamps_sends() -> None:
    data = entry(1) + entry(2, "é ünïcode\n", "stderr") + entry(3, "no newline: a 16 KiB part")
    assert entries_as_follow(data) == (
        follow_of(1) + f"{STAMP.format(2)} é ünïcode\n".encode()
        + f"{STAMP.format(3)} no newline: a 16 KiB part".encode())


def test_a_torn_line_is_skipped_and_the_rest_kept() -> None:
    data = entry(1) + b'{"log":"half of an ent\n' + entry(2) + b"[1, 2]\n"
    assert entries_as_follow(data) == follow_of(1) + follow_of(2)


def test_a_log_is_read_to_its_end_once_the_container_exited(tmp_path: Path) -> None:
    path = tmp_path / "c-json.log"
    path.write_bytes(b"".join(entry(n) for n in range(1, 1001)))
    exited = threading.Event()
    exited.set()
    log = JsonFileLog(str(path), exited)
    assert read_all(log) == b"".join(follow_of(n) for n in range(1, 1001))
    assert log.ended


def test_a_line_the_engine_is_still_writing_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "c-json.log"
    whole = entry(2)
    path.write_bytes(entry(1) + whole[:10])
    exited = threading.Event()
    log = JsonFileLog(str(path), exited)
    chunks = _reader(log)
    assert chunks.get(timeout=WAIT_SECONDS) == follow_of(1)
    with path.open("ab") as file:
        file.write(whole[10:])
    assert chunks.get(timeout=WAIT_SECONDS) == follow_of(2)
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
    assert read_all(log) == follow_of(1) + follow_of(2) + follow_of(3) + follow_of(4)
    assert log.ended


def test_a_log_moved_away_with_nothing_in_its_place_stops_without_having_ended(
        tmp_path: Path) -> None:
    """A rotation caught half done, or a removed container: the shipper asks
    the engine whether the container still runs, and reads again."""
    path = tmp_path / "c-json.log"
    path.write_bytes(entry(1))
    log = JsonFileLog(str(path), threading.Event())
    chunks = _reader(log)
    assert chunks.get(timeout=WAIT_SECONDS) == follow_of(1)
    with path.open("ab") as file:
        file.write(entry(2))
    path.unlink()
    got = b""
    while (chunk := chunks.get(timeout=WAIT_SECONDS)) is not None:
        got += chunk
    assert got == follow_of(2)  # in the file it held, read before it stopped
    assert not log.ended


def test_a_closed_log_stops_without_having_ended(tmp_path: Path) -> None:
    path = tmp_path / "c-json.log"
    path.write_bytes(entry(1))
    log = JsonFileLog(str(path), threading.Event())
    chunks = _reader(log)
    assert chunks.get(timeout=WAIT_SECONDS) == follow_of(1)
    log.close()
    assert chunks.get(timeout=WAIT_SECONDS) is None
    assert not log.ended


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
    stamps = [int(line.split(b" ", 1)[0][20:29]) for line in out.splitlines()]
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


def _reader(log: JsonFileLog) -> queue.Queue[bytes | None]:
    """Each chunk the log yields, then None when it stops (a daemon thread)."""
    chunks: queue.Queue[bytes | None] = queue.Queue()

    def read(stream: Iterator[bytes]) -> None:
        try:
            for chunk in stream:
                chunks.put(chunk)
        finally:
            chunks.put(None)

    threading.Thread(target=read, args=(iter(log),), daemon=True).start()
    return chunks
