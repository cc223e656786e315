"""Shipping each task container's output into its task's Redis log stream.

One `LogShipper` per container follows `docker logs --follow --timestamps`,
or, where the monitor can read it, the engine's own json-file of the log
(enginefiles.py: the same entries, without the engine's decoding), cuts the
stream into lines (loglines.py) and queues them; a shared flusher
writes them to Redis as soon as they are queued. A line reaches Redis one
round trip after Docker handed it over: the flusher sleeps until a shipper
queues a line into an empty queue (or fills a batch of 500), and whatever
arrives while a write is in flight goes in the next one, so a busy log is
written in batches without a timer holding lines back, and a shipper reads
and cuts its next lines while Redis appends its last ones. Writing is
back-pressured: with four batches waiting the shipper writes them itself,
and while Redis refuses it stops reading (Docker keeps the output
meanwhile); the flusher retries every 200 ms.

Each batch is also appended to the task's full log file in the platform's
log tree (PAI_LOG_DIR), right after it reached Redis (logfile.py).

Restart safety: a batch is written by one script, so it reached Redis whole
or not at all (out of memory, Redis refuses a script's first write, never a
later one, so as not to stop it halfway), and its last entry carries, beside
its line, the cursor after it (`loglines.LogCursor`): it says exactly how
far shipping got. A new shipper (a restarted monitor, or a stream that
broke) reads the newest entry's cursor, asks Docker for the log since that
nanosecond and drops what it repeats. (Only the last entry: a cursor on
every line cost about 22 bytes of Redis a line.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from docker.errors import DockerException, NotFound
from docker.models.containers import Container
from redis.exceptions import RedisError
from requests.exceptions import RequestException

from services.monitor.dispatch import backoff_delay
from services.monitor.enginefiles import EngineLogFiles, JsonFileLog
from services.monitor.logfile import TaskLogFile
from services.monitor.loglines import (
    LAST_STREAM_NUMBER,
    FrameSplitter,
    LineSplitter,
    LogCursor,
    ReplayFilter,
    StampedLines,
    advance_to_newest,
)
from services.monitor.observations import Phase, describe, phase_of
from shared.domain.checkpoints import PREFIX as CHECKPOINT_PREFIX
from shared.domain.checkpoints import last_checkpoint_step
from shared.node.containers import TaskRef
from shared.node.engine import BROKEN_STREAM_ERRORS, EngineCalls
from shared.state import checkpoints, keys, logstream
from shared.state.store import Store
from shared.state.store.logs import queue_append

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.2  # the flusher's retry period while Redis refuses
FLUSH_LINES = 500
# How many full batches a shipper leaves to the flusher before it writes
# them itself: its reads go on while Redis appends, and stop if Redis cannot.
BACKLOG_BATCHES = 4
# Entries written by others (no cursor) that may sit after the last shipped one.
_CURSOR_LOOKBACK = 16
_STOP_WAIT_SECONDS = 2.0
# A finished shipper waits this long for the exit handler that drains it;
# after that the flusher forgets it (a later drain just starts afresh).
_FORGET_DONE_AFTER_SECONDS = 60.0
_FINAL_FLUSH_TRIES = 3
# After Docker ended a log stream, how long a shipper waits for the monitor to
# see the container stop before it asks Docker whether it still runs.
EXIT_NOTICE_SECONDS = 1.0
_RAW_READ_BYTES = 64 * 1024


def append_log_entries(r: Any, ref: TaskRef, lines: Sequence[str], max_lines: int,
                       cursor: LogCursor | None = None) -> None:
    """Append lines to the task's bounded stream, the last with `cursor` (the
    cursor after it); the last checkpoint report among them
    (shared/domain/checkpoints.py) is recorded for the attempt in the same
    round trip. A line holds no newline (lines were cut at them); one that
    does is appended as the lines it holds."""
    if not lines:
        return
    key = keys.task_log(ref.job_id, ref.attempt, ref.role, ref.index)
    pipe = r.pipeline(transaction=False)
    texts = queue_append(pipe, key, lines, max_lines,
                         cursor.encode() if cursor is not None else "")
    step = last_checkpoint_step(lines) if any(CHECKPOINT_PREFIX in t for t in texts) else None
    if step is not None:
        checkpoints.record_step(pipe, ref.job_id, ref.attempt, step)
    pipe.execute()


def read_log_cursor(r: Any, ref: TaskRef) -> LogCursor | None:
    """How far shipping got for this task: the cursor of its newest shipped line."""
    key = keys.task_log(ref.job_id, ref.attempt, ref.role, ref.index)
    for _entry_id, fields in r.xrevrange(key, count=_CURSOR_LOOKBACK):
        cursor = LogCursor.decode(fields.get(logstream.CURSOR_FIELD))
        if cursor is not None:
            return cursor
    return None


class LogShipper:
    """Follows one container's log until it stops, or until told to stop."""

    def __init__(self, store: Store, container: Container, ref: TaskRef, max_lines: int,
                 batch_lines: int = FLUSH_LINES, log_dir: str | None = None,
                 max_file_bytes: int = 0,
                 on_pending: Callable[[LogShipper], None] | None = None,
                 log_group: int | None = None, files: EngineLogFiles | None = None) -> None:
        self.store, self.container, self.ref = store, container, ref
        self.files = files  # where the engine's log files are, if this monitor reads them
        self._engine = EngineCalls(container.client)  # its follows open their own connections
        self.log_group = log_group
        self._on_pending = on_pending
        self.log_dir, self.max_file_bytes = log_dir, max_file_bytes
        self.task_name = describe(ref)
        self.max_lines, self.batch_lines = max_lines, batch_lines
        self.cursor: LogCursor | None = None
        self._pending: list[str] = []
        self._pending_cursor: LogCursor | None = None  # the cursor after the last pending line
        self._lock = threading.Lock()  # guards _pending and _stream
        self._write_lock = threading.Lock()  # one write at a time, so lines stay in order
        self._stream: Any = None
        self._file: TaskLogFile | None = None
        self._unforeseen_logged = False  # a failed write not Redis's: traced once
        self._closing = threading.Event()
        self._exited = threading.Event()
        self._done = threading.Event()
        self.done_at: float | None = None  # time.monotonic() when it finished
        self._thread = threading.Thread(
            target=self._run, name=f"pai-log-{str(container.id)[:12]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None) -> bool:
        """True once the log ended (the container stopped) and all of it was handed on."""
        return self._done.wait(timeout)

    def container_exited(self) -> None:
        """The monitor saw the container exit: when the stream ends, do not ask Docker
        whether it still runs (one inspect less per task), just read once more.
        A log file being read is read to its end now."""
        self._exited.set()
        with self._lock:
            stream = self._stream
        if isinstance(stream, JsonFileLog):
            stream.wake()

    def stop(self) -> None:
        """Stop following now (the monitor is shutting down, or a drain timed out)."""
        self._closing.set()
        with self._lock:
            stream = self._stream
        close_stream(stream)

    def abandon(self) -> None:
        """Forget unwritten lines: a new shipper will read them again from Docker."""
        self.stop()
        with self._write_lock, self._lock:
            self._pending, self._pending_cursor = [], None

    def flush(self) -> bool:
        """Write the waiting lines; False (and they wait on) when Redis refused."""
        with self._write_lock:
            with self._lock:
                batch, self._pending = self._pending, []
                cursor = self._pending_cursor
            if not batch:
                return True
            try:
                append_log_entries(self.store.r, self.ref, batch, self.max_lines, cursor)
            except Exception as error:
                # Redis refused, or something unforeseen: the lines wait for the
                # next write, and the flusher every shipper shares goes on.
                if isinstance(error, RedisError) or self._unforeseen_logged:
                    log.warning("cannot ship %d log lines of %s: %s", len(batch),
                                self.task_name, error)
                else:  # the trace once: a failure that repeats is retried as often
                    self._unforeseen_logged = True
                    log.exception("cannot ship %d log lines of %s", len(batch), self.task_name)
                with self._lock:
                    self._pending[:0] = batch
                return False
            if self._file is not None:
                try:
                    self._file.append(batch)
                except Exception:  # the lines are in Redis; the file stops here, whole
                    log.exception("cannot write %d log lines of %s to its file; the log "
                                  "stays in Redis only", len(batch), self.task_name)
                    self._file = None
            return True

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._file = self._open_log_file()
            if self._load_cursor():
                self._follow()
        except Exception:
            log.exception("log shipping of %s failed", self.task_name)
        finally:
            for attempt in range(_FINAL_FLUSH_TRIES):
                if self.flush():
                    break
                self._closing.wait(backoff_delay(attempt + 1, 0.2, 2.0))
            self.done_at = time.monotonic()
            self._done.set()

    def _open_log_file(self) -> TaskLogFile | None:
        """The full log's file in the platform's log tree, if there is one."""
        return TaskLogFile(self.log_dir, self.ref, self.max_file_bytes,
                           self.log_group) if self.log_dir else None

    def _load_cursor(self) -> bool:
        failures = 0
        while not self._closing.is_set():
            try:
                self.cursor = read_log_cursor(self.store.r, self.ref)
                return True
            except RedisError as error:
                failures += 1
                log.warning("cannot read the log cursor of %s: %s", self.task_name, error)
                self._closing.wait(backoff_delay(failures, 0.2, 5.0))
        return False

    def _follow(self) -> None:
        """Read until the container stops; reopen when the stream breaks.

        Docker ends a follow stream when the container stops, but this engine
        (20.10) may end it before the last lines of a container that exits
        at once, and a broken connection ends the SDK's stream the same way.
        So after any end: once the container stopped (the monitor saw it
        stop, or Docker says so), read once more from the cursor, which
        reads to the log's end; if it still runs, resume from the cursor.
        When Docker ended the stream itself (`LogStream.ended`) the monitor's
        notice of the exit is waited for, briefly, instead of an inspect.
        The engine's log file ends only after the exit, with every line read.
        """
        failures = 0
        while not self._closing.is_set():
            received, ended, whole = self._read_stream()
            if self._closing.is_set() or whole:
                return
            if (ended and self._exited.wait(EXIT_NOTICE_SECONDS)) \
                    or self._exited.is_set() or not self._still_running():
                self._read_stream()
                return
            failures = 0 if received else failures + 1
            self._closing.wait(backoff_delay(failures, 0.2, 5.0))

    def _read_stream(self) -> tuple[bool, bool, bool]:
        """One pass over the log from the cursor on: whether any new line came,
        whether the stream ended as Docker ends it (not broke), and whether
        it was the engine's log file read to the end after the exit (the
        whole log)."""
        stream: LogStream | JsonFileLog | None = self._open_file()
        if stream is None:
            since = self.cursor.since if self.cursor is not None else None
            try:
                stream = LogStream(self._engine, str(self.container.id), since)
            except NotFound:
                return False, False, False
            except (DockerException, RequestException) as error:
                log.warning("cannot read the log of %s: %s", self.task_name, error)
                return False, False, False
        with self._lock:
            self._stream = stream
        if self._closing.is_set():
            close_stream(stream)
        replay, received = ReplayFilter(self.cursor), False
        try:
            for lines in stream:
                received = self._accept(lines, replay) or received
        except (DockerException, RequestException, OSError) as error:
            log.debug("the log stream of %s broke: %s", self.task_name, error)
        finally:
            with self._lock:
                self._stream = None
            close_stream(stream)
        ended = stream.ended and not self._closing.is_set()
        return received, ended, ended and isinstance(stream, JsonFileLog)

    def _open_file(self) -> JsonFileLog | None:
        """The container's log file, read from its start (the replay filter
        skips what was shipped), where this monitor reads the engine's files
        and the file is there; None: follow through the engine."""
        if self.files is None:
            return None
        try:
            return JsonFileLog(self.files.path(str(self.container.id)), self._exited,
                               self.cursor.ts_ns if self.cursor is not None else None)
        except OSError as error:
            log.debug("following the log of %s through the engine: %s", self.task_name, error)
            return None

    def _accept(self, lines: StampedLines, replay: ReplayFilter) -> bool:
        """Queue the lines (all that one read brought) the replay does not
        skip, for the flusher; write them here once `BACKLOG_BATCHES`
        batches wait (Redis slower than the log, or refusing). Whether any
        was new."""
        lines = lines.without(replay)
        if not lines:
            return False
        # Only a batch's last line carries a cursor (append_log_entries):
        # the one after all of this read's lines.
        self.cursor = cursor = advance_to_newest(self.cursor, lines.newest())
        with self._lock:
            first = not self._pending
            self._pending += lines.texts
            self._pending_cursor = cursor
            waiting = len(self._pending)
        full, backlog = waiting >= self.batch_lines, waiting >= self.batch_lines * BACKLOG_BATCHES
        filled = full and waiting - len(lines) < self.batch_lines  # full since this read
        if backlog or (full and self._on_pending is None):
            failures = 0
            while not self.flush() and not self._closing.is_set():
                failures += 1
                self._closing.wait(backoff_delay(failures, 0.2, 5.0))
        elif (first or filled) and self._on_pending is not None:
            # The flusher writes them while this reads on (and, while Redis
            # refuses, tries again each FLUSH_SECONDS, not at each read).
            self._on_pending(self)
        return True

    def _still_running(self) -> bool:
        try:
            state = self.container.client.api.inspect_container(self.container.id)["State"]
        except NotFound:
            return False
        except (DockerException, RequestException) as error:
            log.warning("cannot inspect %s: %s", self.task_name, error)
            return True  # ask again after the backoff
        return phase_of(state.get("Status")) == Phase.RUNNING


class LogStream:
    """One `docker logs --follow --timestamps` response (`EngineCalls.follow_log`,
    without the inspect the SDK makes first to learn whether the container
    has a TTY), telling whether it `ended` as Docker ends a follow (the
    container stopped) or broke: a reset, or (the follow is read in HTTP/1.0,
    whose body ends when the connection does) an end inside a frame. An
    engine that closes the connection between two frames reads as an end,
    which costs the shipper its wait for the exit's notice and an inspect.

    The first byte says how the output comes: a multiplexed stream (no TTY)
    starts with a frame header, whose first byte is the stream's number
    (0-3, 3 the engine's own errors); a TTY's raw stream starts with a
    line's timestamp, a digit.
    """

    def __init__(self, engine: EngineCalls, container_id: str, since: str | None) -> None:
        self._response = engine.follow_log(container_id, since)
        self.ended = False
        self._closed = False

    def __iter__(self) -> Iterator[StampedLines]:
        """Each chunk's complete lines, stamped; at the end (not a break) the
        log's last line, if it has no newline. A broken stream's unfinished
        line waits for the resumed read, which has it whole."""
        splitter = LineSplitter()
        try:
            for chunk in self._chunks():
                lines = splitter.feed(chunk)
                if lines:
                    yield StampedLines.of_follow(lines)
        except BROKEN_STREAM_ERRORS:
            return  # broke: not `ended`
        if self._closed:
            return  # a response closed under its reader may read as an end
        last = splitter.finish()
        if last:
            yield StampedLines.of_follow(last)
        self.ended = True

    def _chunks(self) -> Iterator[bytes]:
        response = self._response
        first = response.read(1)
        if not first:
            return
        frames = None if first[0] > LAST_STREAM_NUMBER else FrameSplitter()
        chunk = first
        while chunk:
            data = chunk if frames is None else frames.feed(chunk)
            if data:
                yield data
            chunk = response.read1(_RAW_READ_BYTES)  # whatever has arrived, up to a bound
        if frames is not None and frames.pending:
            raise ConnectionAbortedError("the log stream ended inside a frame")

    def close(self) -> None:
        self._closed = True
        self._response.close()


def close_stream(stream: Any) -> None:
    """Close a Docker stream from any thread; it may be closed or broken already."""
    if stream is None:
        return
    try:
        stream.close()
    except Exception as error:  # an already closed socket, a half-open response
        log.debug("closing a Docker stream: %s", error)


class LogShipping:
    """Every shipper of this node's containers, and the flusher that writes them."""

    def __init__(self, store: Store, max_lines: int, flush_seconds: float = FLUSH_SECONDS,
                 batch_lines: int = FLUSH_LINES, log_dir: str | None = None,
                 max_file_bytes: int = 0, log_group: int | None = None,
                 files: EngineLogFiles | None = None) -> None:
        self.store, self.max_lines, self.log_dir = store, max_lines, log_dir
        self.files = files
        self.log_group = log_group
        self.max_file_bytes = max_file_bytes
        self.flush_seconds, self.batch_lines = flush_seconds, batch_lines
        self._shippers: dict[str, LogShipper] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._wake = threading.Condition(self._lock)
        self._waiting: set[LogShipper] = set()  # shippers that queued a line since the last write

    def _queued(self, shipper: LogShipper) -> None:
        """A shipper queued a line into its empty queue: have the flusher write it now."""
        with self._lock:
            self._waiting.add(shipper)
            self._wake.notify()

    def ensure(self, container: Container, ref: TaskRef) -> LogShipper:
        """The shipper following this container, started if there is none yet."""
        key = str(container.id)
        with self._lock:
            shipper = self._shippers.get(key)
            if shipper is not None and not shipper.done:
                return shipper
            if shipper is not None:
                shipper.abandon()  # what it could not write, the new one reads again
            shipper = LogShipper(self.store, container, ref, self.max_lines, self.batch_lines,
                                 self.log_dir, self.max_file_bytes, on_pending=self._queued,
                                 log_group=self.log_group, files=self.files)
            self._shippers[key] = shipper
            shipper.start()
            if self._flusher is None and not self._stop.is_set():
                self._flusher = threading.Thread(
                    target=self._flush_loop, name="pai-log-flusher", daemon=True)
                self._flusher.start()
        return shipper

    def drain(self, container: Container, ref: TaskRef, timeout: float) -> bool:
        """Ship a stopped container's log to its end (bounded); True if all of it went."""
        with self._lock:
            shipper = self._shippers.get(str(container.id))
        if shipper is None:
            shipper = self.ensure(container, ref)
        shipper.container_exited()
        complete = shipper.wait(timeout)
        if not complete:
            log.warning("the log of %s did not end within %.0f s: shipping what arrived",
                        describe(ref), timeout)
            shipper.stop()
            shipper.wait(_STOP_WAIT_SECONDS)
        complete = shipper.flush() and complete
        self._forget(str(container.id), shipper)
        return complete

    def finish(self, container_id: str, timeout: float) -> None:
        """A container vanished: write what its shipper read, and drop it."""
        with self._lock:
            shipper = self._shippers.get(container_id)
        if shipper is None:
            return
        if not shipper.wait(timeout):
            shipper.stop()
            shipper.wait(_STOP_WAIT_SECONDS)
        shipper.flush()
        self._forget(container_id, shipper)

    def close(self, timeout: float = 5.0) -> None:
        """Stop following everything, writing what was read (a restart resumes)."""
        self._stop.set()
        with self._lock:
            self._wake.notify()
            shippers = list(self._shippers.values())
            self._shippers.clear()
            flusher, self._flusher = self._flusher, None
        for shipper in shippers:
            shipper.stop()
        for shipper in shippers:
            shipper.wait(timeout)
            shipper.flush()
        if flusher is not None:
            flusher.join(timeout)

    def _forget(self, key: str, shipper: LogShipper) -> None:
        with self._lock:
            if self._shippers.get(key) is shipper:
                del self._shippers[key]

    def _flush_loop(self) -> None:
        """Write queued lines as soon as they are queued; every `flush_seconds`, also
        retry what Redis refused and forget shippers finished long ago. With no
        shipper at all it sleeps until lines come (a node with nothing running
        wakes for nothing)."""
        last_sweep = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                if not self._waiting:
                    self._wake.wait(self.flush_seconds if self._shippers else None)
                waiting, self._waiting = self._waiting, set()
                now = time.monotonic()
                sweep = now - last_sweep >= self.flush_seconds
                shippers = list(self._shippers.items()) if sweep else []
            if self._stop.is_set():
                return
            for shipper in waiting:
                shipper.flush()
            if not sweep:
                continue
            last_sweep = now
            for key, shipper in shippers:
                done_at = shipper.done_at  # read first: a finished shipper gets no more lines
                if shipper.flush() and done_at is not None \
                        and now - done_at > _FORGET_DONE_AFTER_SECONDS:
                    self._forget(key, shipper)
