"""One Redis reader per followed log per process, its lines fanned out to every follower.

Five hundred people following one job's log must not mean five hundred
XREADs for every line, five hundred parses of the reply and five hundred
frames built: that work comes in a burst with every line, and a request that
arrives during the burst waits behind it. Here one reader (a thread, so a
greenlet under gevent) waits on the stream and appends each line, framed
once, to a shared feed; each follower only takes what is new and writes it.

A follower joins the feed before it reads its own start (the tail, or the
lines after its Last-Event-ID) from Redis, so no line falls between the two;
it skips ids it has already sent. A follower that falls further behind than
the feed keeps reads the gap from Redis again. Followers are woken a small
group at a time, so a request never waits behind the whole fan-out. The reader also notices when
the task has settled and every line is in the feed, and then stops; it stops
too when the last follower leaves.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field

import gevent
import redis
from gevent import monkey

from services.api import sse
from shared.state.store import Store

log = logging.getLogger("pai.api")

FEED_LINES = 10_000  # lines a feed keeps at least, for followers that fall behind
READ_BLOCK_MS = 1000
RETRY_SECONDS = 1.0
WAKE_GROUP = 4


@dataclass(frozen=True)
class TaskLog:
    job_id: str
    attempt: int
    role: str
    index: int


@dataclass
class Feed:
    """The lines read so far: (entry id, frame), with the absolute position of the first."""

    last_id: str
    cond: threading.Condition = field(default_factory=threading.Condition)
    entries: list[tuple[str, str]] = field(default_factory=list)
    base: int = 0
    settled: bool = False
    followers: int = 0

    @property
    def end(self) -> int:
        return self.base + len(self.entries)

    def since(self, position: int) -> tuple[list[tuple[str, str]], int, bool]:
        """(entries from `position` on, the new position, whether some were dropped).

        Call with `cond` held."""
        dropped = position < self.base
        start = max(0, position - self.base)
        return self.entries[start:], self.end, dropped

    def add(self, entry_id: str, frame: str) -> None:
        """Append a line; past 2 x FEED_LINES, drop the oldest down to FEED_LINES
        (in one go, so that the cost of dropping is spread over the lines).

        Call with `cond` held."""
        self.entries.append((entry_id, frame))
        self.last_id = entry_id
        if len(self.entries) > 2 * FEED_LINES:
            drop = len(self.entries) - FEED_LINES
            del self.entries[:drop]
            self.base += drop


def _let_others_run() -> None:
    """Under gevent (the API's workers): wait until the loop has polled its
    sockets and run every ready greenlet. With real threads (tests, the
    development server): let the woken ones have the interpreter."""
    if monkey.is_module_patched("threading"):
        gevent.idle()
    else:
        time.sleep(0)


class LogHub:
    """The feeds of one process, keyed by task log."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.lock = threading.Lock()
        self.feeds: dict[TaskLog, Feed] = {}

    def join(self, task: TaskLog) -> Feed:
        with self.lock:
            feed = self.feeds.get(task)
            if feed is None:
                last = self.store.last_log_id(task.job_id, task.attempt, task.role, task.index)
                feed = self.feeds[task] = Feed(last_id=last)
                threading.Thread(target=self._read, args=(task, feed), daemon=True,
                                 name=f"log-feed {task.job_id}").start()
            feed.followers += 1
            return feed

    def leave(self, feed: Feed) -> None:
        with self.lock:
            feed.followers -= 1

    @staticmethod
    def _wake(feed: Feed, followers: int) -> None:
        """Wake the followers a group at a time, letting requests in between.

        Under gevent everything woken at once runs before a request whose
        Redis reply arrives meanwhile. `gevent.sleep(0)` would not help: it
        yields to greenlets already runnable, and the loop may not poll
        sockets until the whole fan-out is done. `gevent.idle()` returns only
        once the loop has polled and run what was ready, so a request waits
        for one group of frames at most.
        """
        for _ in range(math.ceil(followers / WAKE_GROUP) or 1):
            with feed.cond:
                feed.cond.notify(WAKE_GROUP)
            _let_others_run()

    def _read(self, task: TaskLog, feed: Feed) -> None:
        """Read the stream into the feed until no one follows or the task has settled."""
        args = (task.job_id, task.attempt, task.role, task.index)
        while True:
            with self.lock:
                if feed.followers <= 0:
                    self.feeds.pop(task, None)
                    return
            try:
                entries = self.store.follow_log(*args, after=feed.last_id,
                                                block_ms=READ_BLOCK_MS)
                # The monitor ships a task's last lines before settling it: once
                # it is settled and one more read finds nothing, every line is in.
                settled = not entries and self.store.task_settled(*args) \
                    and not self.store.follow_log(*args, after=feed.last_id, block_ms=0)
            except redis.RedisError as error:
                log.warning("reading the log of %s: %s", task.job_id, error)
                time.sleep(RETRY_SECONDS)
                continue
            with feed.cond:
                for entry_id, line in entries:
                    feed.add(entry_id, sse.frame(line, event_id=entry_id))
                feed.settled = settled
                followers = feed.followers
            if entries or settled:
                self._wake(feed, followers)
            if settled:
                with self.lock:
                    if self.feeds.get(task) is feed:
                        del self.feeds[task]  # later followers start a feed of their own
                return
