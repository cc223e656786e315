"""A container's log read from the engine's own `json-file`, not through the engine.

The engine keeps each container's output in
`<DockerRootDir>/containers/<id>/<id>-json.log`, one JSON object a line:
`{"log": "<text>\\n", "stream": "stdout", "time": "<RFC 3339, ns>"}`. A
follow through the engine's API reads that same file, decodes each object,
and sends the text on, framed, over HTTP. The engine's decoding runs on the
node's cores beside the job, and for a long log it is slower than the job
that writes it (docs/performance-log.md, 2026-11-29). So, where the monitor
can open the file, it reads the file itself:

- `JsonFileLog` gives what `logs.LogStream` gives: the lines of each read,
  stamped (`loglines.StampedLines`), so the shipper's replay filter and
  cursor are the follow's; they are the entries' own texts and times
  (`EntryLines`), with no follow's byte stream rebuilt and cut again;
- complete lines only: a read that stops inside the engine's write keeps the
  rest for the next read;
- a resumed read (a restarted monitor, a broken read) starts at the file's
  start, as a follow `since` the cursor would, but passes over whole reads
  older than the cursor without parsing them;
- the file's end is waited for with inotify, so a quiet task costs nothing;
  `wake()` (the container's exit, a stop) ends the wait at once;
- after the container exited, everything up to the file's end is its whole
  log: the engine closes the log writer before it reports the exit. The
  stream then `ended`, as a follow ends;
- an engine set to rotate its logs (`max-size`) renames the file and starts
  a new one: the old one is read to its end, then the new one from its
  start. Caught between the two (no file at the path), the stream stops
  without having `ended`, as a broken follow does, and the shipper reads
  again (skipping what it shipped).

`EngineLogFiles` says where the files are, if anywhere: only when the
engine's log driver is `json-file` (its default) and the folder is there and
readable, or where PAI_LOG_ENGINE_FILES names the folder for an agent that
sees it elsewhere (a container with the folder mounted). Everything else
follows through the engine, as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import itertools
import json
import logging
import operator
import os
import re
import select
import threading
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import orjson

from services.monitor.loglines import (
    MAX_LINE_BYTES,
    StampedLines,
    parse_docker_timestamp,
    render_text,
)

log = logging.getLogger(__name__)

# A read's bound, as a follow's (logs.py): a batch of about a thousand short
# lines, which one append script writes and trims (Redis's approximate trim
# evicts at most 10,000 entries a call).
READ_BYTES = 64 * 1024
# Without inotify (its limits reached), how often the file's end is looked at.
POLL_SECONDS = 0.05
# inotify instances kept for the next log files (`_Inotify`): about as many as a
# node's logs followed at once, well under the kernel's 128 a user by default
MAX_IDLE_INOTIFY = 16
# inotify(7): what changes the file, or moves it away.
_IN_MODIFY, _IN_ATTRIB, _IN_DELETE_SELF, _IN_MOVE_SELF = 0x2, 0x4, 0x400, 0x800
_IN_NONBLOCK, _IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
_WATCHED = _IN_MODIFY | _IN_ATTRIB | _IN_DELETE_SELF | _IN_MOVE_SELF
JSON_FILE_DRIVER = "json-file"
AUTO, OFF = "auto", "off"


# A JSON escape of a UTF-16 surrogate, which no UTF-8 text holds: the engine
# never writes one, but a line decoded from one is made safe to encode.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# A text this short is under the line cap whatever its characters (4 bytes
# each at most), so it is kept as it is.
_PLAIN_CHARS = MAX_LINE_BYTES // 4
_LOG, _TIME = operator.itemgetter("log"), operator.itemgetter("time")
_WITHOUT_NEWLINE = operator.itemgetter(slice(None, -1))


def _entries(data: bytes) -> list[Any]:
    """The JSON values of complete json-file lines (`data` ends with a
    newline), in one parse (orjson's, in half json's time: the same values
    for the engine's entries, whose fields are strings; json's where orjson
    refuses the text, as for a lone surrogate's escape); line by line,
    skipping any that is not JSON, if the whole does not parse (a torn write
    the engine never finished)."""
    whole = b"[" + data[:-1].replace(b"\n", b",") + b"]"
    try:
        entries: list[Any] = orjson.loads(whole)
        return entries
    except orjson.JSONDecodeError:
        pass
    try:
        entries = json.loads(whole)
        return entries
    except ValueError:
        entries = []
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                entries.append(json.loads(line))
        return entries


class EntryLines:
    """The lines of json-file entries, as the shipper takes them
    (`loglines.StampedLines`): each entry's text without its newline,
    stamped with the entry's time, rendered as a follow's lines are.

    The engine cuts a message longer than its 16 KiB buffer into entries
    whose text has no newline but the last's: they are one line, stamped
    with the first's time and capped (`loglines.MAX_LINE_BYTES`). A value
    that is not an entry (a torn write) is skipped. A read of whole short
    lines (nearly every read) is taken in bulk, without a step a line in
    Python.
    """

    def __init__(self) -> None:
        self._part: list[str] = []  # the entries of an unfinished line, capped
        self._part_chars = 0
        self._part_stamp: int | None = None

    def feed(self, data: bytes) -> StampedLines:
        """The lines that these complete lines of the file finish."""
        entries = _entries(data)
        plain = _SURROGATE_ESCAPE.search(data) is None
        if plain and not self._part:
            try:
                texts, times = list(map(_LOG, entries)), list(map(_TIME, entries))
                if all(map(str.endswith, texts, itertools.repeat("\n"))) \
                        and not any(map(str.endswith, texts, itertools.repeat("\r\n"))) \
                        and max(map(len, texts), default=0) <= _PLAIN_CHARS:
                    return StampedLines.of_utc_times(list(map(_WITHOUT_NEWLINE, texts)), times)
            except (TypeError, KeyError):
                pass  # not all of them entries with text and time: one by one
        return self._each(entries, plain)

    def finish(self) -> StampedLines:
        """The log's last line, if it ended without a newline."""
        if not self._part:
            return StampedLines([], stamps=[])
        stamp, text = self._joined()
        return StampedLines([text], stamps=[stamp])

    def _each(self, entries: list[Any], plain: bool) -> StampedLines:
        texts: list[str] = []
        stamps: list[int | None] = []
        for entry in entries:
            try:
                text, time = entry["log"], entry.get("time")
            except (TypeError, KeyError, AttributeError):
                continue
            if type(text) is not str:
                continue
            stamp = parse_docker_timestamp(time) if type(time) is str else None
            if self._part or not text.endswith("\n"):
                line = self._join(text, stamp)
                if line is None:
                    continue
                stamp, text = line
            elif plain and len(text) <= _PLAIN_CHARS and not text.endswith("\r\n"):
                text = text[:-1]
            else:
                text = render_text(text[:-1])
            texts.append(text)
            stamps.append(stamp)
        return StampedLines(texts, stamps=stamps)

    def _join(self, text: str, stamp: int | None) -> tuple[int | None, str] | None:
        """One more entry of a line cut into several; the line once it is whole."""
        if not self._part:
            self._part_stamp = stamp
        room = MAX_LINE_BYTES - self._part_chars
        if room > 0:
            self._part.append(text[:room])
            self._part_chars += min(len(text), room)
        return self._joined() if text.endswith("\n") else None

    def _joined(self) -> tuple[int | None, str]:
        text = "".join(self._part)
        stamp = self._part_stamp
        self._part, self._part_chars, self._part_stamp = [], 0, None
        return stamp, render_text(text[:-1] if text.endswith("\n") else text)


class _Inotify:
    """inotify watches on one file at a time, and a pipe to wake its waiter.

    Instances are kept for the next file (`take`, `release`), not closed:
    closing an inotify instance waits out the kernel's grace period
    (fsnotify's `synchronize_srcu`), 13 ms at the median and up to 30 on a
    busy node, and that close ended every task's log, on the way from its
    container's exit to the exit recorded (docs/performance-log.md,
    2026-11-30). Dropping a watch does not wait. What a reused instance may
    still hold of its last file (an event, a late wake) only wakes its new
    waiter once for nothing: the waiter reads the file again."""

    _libc: Any = None
    _idle: ClassVar[list[_Inotify]] = []  # released, for the next file
    _idle_lock = threading.Lock()

    def __init__(self) -> None:
        self._fd = -1
        self._watches: list[int] = []
        self._held = True  # by one log, until it releases it
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()  # a late wake never writes to a closed (reused) fd
        libc = self._load()
        if libc is not None:
            fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
            if fd < 0:
                log.warning("no inotify (%s): log files are looked at every %.0f ms",
                            os.strerror(ctypes.get_errno()), POLL_SECONDS * 1000)
            self._fd = fd

    @classmethod
    def take(cls) -> _Inotify:
        """One released before, else a new one."""
        with cls._idle_lock:
            notify = cls._idle.pop() if cls._idle else None
        if notify is None:
            return cls()
        notify._held = True
        notify._drain()
        return notify

    @classmethod
    def _load(cls) -> Any:
        if cls._libc is None:
            try:
                cls._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6",
                                        use_errno=True)
            except OSError:
                cls._libc = False
        return cls._libc or None

    def watch(self, path: str) -> None:
        """Watch `path` (the file now there; a renamed one is dropped by the kernel)."""
        if self._fd < 0:
            return
        watch = self._libc.inotify_add_watch(self._fd, os.fsencode(path), _WATCHED)
        if watch < 0:
            log.debug("cannot watch %s: %s", path, os.strerror(ctypes.get_errno()))
        elif watch not in self._watches:
            self._watches.append(watch)

    def wait(self) -> None:
        """Until the file changes or `wake()`; a poll's period without inotify."""
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        if self._fd >= 0:
            poller.register(self._fd, select.POLLIN)
        poller.poll(None if self._fd >= 0 else POLL_SECONDS * 1000)
        self._drain()

    def _drain(self) -> None:
        for fd in (self._fd, self._wake_r):
            if fd >= 0:
                with contextlib.suppress(BlockingIOError):
                    while os.read(fd, 4096):
                        pass

    def wake(self) -> None:
        with self._lock, contextlib.suppress(OSError):  # BlockingIOError: woken already
            if self._wake_w >= 0:
                os.write(self._wake_w, b"x")

    def release(self) -> None:
        """Done with its file: its watches dropped, kept for the next file
        (closed once MAX_IDLE_INOTIFY wait already). Once only: a second
        release would hand it to two logs."""
        if not self._held:
            return
        self._held = False
        for watch in self._watches:  # one the kernel dropped (file gone) fails: fine
            self._libc.inotify_rm_watch(self._fd, watch)
        self._watches = []
        with _Inotify._idle_lock:
            if self._wake_w >= 0 and len(_Inotify._idle) < MAX_IDLE_INOTIFY:
                _Inotify._idle.append(self)
                return
        self.close()

    def close(self) -> None:
        with self._lock:
            fds = (self._fd, self._wake_r, self._wake_w)
            self._fd = self._wake_r = self._wake_w = -1
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


class JsonFileLog:
    """One container's json-file log, read from its start to the container's
    end (`exited`) or to `close()`; iterate it as a `LogStream`.

    Opening raises OSError (the file is not there, or not readable): the
    caller follows through the engine instead.
    """

    def __init__(self, path: str, exited: threading.Event,
                 skip_before_ns: int | None = None) -> None:
        self.path, self._exited = path, exited
        # A resumed read's cursor: whole reads of entries all older than it
        # are passed over unparsed (the replay filter drops the rest exactly).
        self._skip_before_ns = skip_before_ns
        self.ended = False
        self._closed = False
        self._notify = _Inotify.take()
        self._notify.watch(path)  # before the first read: no change goes unseen
        try:
            self._file = open(path, "rb")  # noqa: SIM115 (kept open across reads, closed at the end)
        except OSError:
            self._notify.release()
            raise

    def __iter__(self) -> Iterator[StampedLines]:
        entries = EntryLines()
        pending = b""
        gone = False  # the path held nothing at the last look: one more read, then stop
        try:
            while not self._closed:
                # The exit looked at before the read: once it is seen, the file
                # holds every line, so the end this read reaches is the log's.
                exited = self._exited.is_set()
                chunk = self._file.read(READ_BYTES)
                if chunk:
                    data = pending + chunk
                    cut = data.rfind(b"\n") + 1
                    pending = data[cut:]
                    if cut and self._passed_over(data[:cut]):
                        continue
                    if cut:
                        lines = entries.feed(data[:cut])
                        if lines:
                            yield lines
                    continue
                if self._reopen_if_rotated():
                    gone = False
                    continue
                if exited:
                    last = entries.finish()
                    if last and not self._closed:
                        yield last
                    self.ended = not self._closed
                    return
                if gone:
                    return
                if not os.path.exists(self.path):
                    # Moved away with nothing in its place yet: a rotation
                    # half done, or the container removed. Once what the file
                    # in hand got meanwhile is read, the stream stops as a
                    # broken follow does, and the caller looks again.
                    gone = True
                    continue
                self._notify.wait()
        finally:
            self._release()

    def _passed_over(self, lines: bytes) -> bool:
        """Whether these complete lines are all older than the resumed read's
        cursor (their last entry is), so none needs parsing; the first read
        that reaches the cursor ends the skipping."""
        if self._skip_before_ns is None:
            return False
        last = lines[lines.rfind(b"\n", 0, len(lines) - 1) + 1:]
        try:
            stamp = parse_docker_timestamp(str(json.loads(last).get("time", "")))
        except (ValueError, AttributeError):
            stamp = None
        if stamp is not None and stamp < self._skip_before_ns:
            return True
        self._skip_before_ns = None
        return False

    def wake(self) -> None:
        """Look at the file again now (the container exited)."""
        self._notify.wake()

    def close(self) -> None:
        """Stop reading (from any thread)."""
        self._closed = True
        self._notify.wake()

    def _reopen_if_rotated(self) -> bool:
        """At the end of the file in hand: if another is now at the path (the
        engine rotated its log), go on with that one, from its start."""
        try:
            now = os.stat(self.path)
        except OSError:
            return False
        if now.st_ino == os.fstat(self._file.fileno()).st_ino:
            return False
        try:
            rotated = open(self.path, "rb")  # noqa: SIM115
        except OSError:
            return False
        self._notify.watch(self.path)
        self._file.close()
        self._file = rotated
        return True

    def _release(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
        self._notify.release()


class EngineLogFiles:
    """Where this node's engine keeps its containers' folders, as the monitor
    sees them; `None` from `discover` where logs are read through the engine."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def path(self, container_id: str) -> str:
        return os.path.join(self.folder, container_id, f"{container_id}-json.log")

    @classmethod
    def discover(cls, client: Any, setting: str) -> EngineLogFiles | None:
        """From PAI_LOG_ENGINE_FILES (`engine_folder`), with the engine's
        `docker info`; None, logged, where logs go through the engine."""
        if setting == OFF:
            return None
        try:
            info = client.info()
        except Exception as error:  # the engine unreachable now: the follow still works
            log.warning("cannot ask the engine where its logs are (%s): following them "
                        "through the engine", error)
            return None
        folder = engine_folder(info, setting)
        if folder is None:
            log.info("the engine logs with %s, not json-file: following logs through the "
                     "engine", info.get("LoggingDriver"))
            return None
        if not os.access(folder, os.R_OK | os.X_OK):
            log.info("cannot read the engine's containers folder %s: following logs through "
                     "the engine", folder)
            return None
        log.info("reading container logs from the engine's files in %s", folder)
        return cls(folder)


def engine_folder(info: Mapping[str, Any], setting: str) -> str | None:
    """Where the engine described by `info` (`docker info`) keeps its
    containers' folders, as PAI_LOG_ENGINE_FILES says to look for them: None
    for `off` or an engine whose log driver is not json-file; the setting's
    own folder; for `auto`, `<DockerRootDir>/containers`."""
    if setting == OFF or info.get("LoggingDriver") != JSON_FILE_DRIVER:
        return None
    if setting != AUTO:
        return setting
    root = info.get("DockerRootDir")
    return os.path.join(root, "containers") if isinstance(root, str) and os.path.isabs(root) \
        else None
