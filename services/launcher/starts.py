"""The launcher's feed of starts: it takes the tasks placed on its node from
the node's stream (shared/state/starts.py) and starts them on a pool of
threads.

- Up to SLOTS starts run at once (container creation blocks on Docker, and
  an image pull may take minutes: the others go on meanwhile). The feed
  takes more entries only when a slot is free, so a burst waits in Redis,
  not in the launcher's memory.
- An entry is done (acknowledged and deleted) once every start it names has
  run. A start that raised leaves its entry pending; the feed reads its
  pending entries when it begins and every RECOVER_SECONDS after, and hands
  out again those not already in hand.
- A lost link to Redis is waited out; the pending entries are read again
  once it is back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import redis

from shared.infra import links
from shared.state.starts import Entry, StartReader, StartRef

log = logging.getLogger("pai.launcher")

SLOTS = 8
RECOVER_SECONDS = 30.0
RETRY_SECONDS = 1.0
# a blocking read returns at least this often, so a stop is seen within it
BLOCK_MS = int(links.BLOCK_CHUNK_SECONDS * 1000)


class StartFeed:
    def __init__(self, reader: StartReader, start: Callable[[str, int, str, int], None],
                 slots: int = SLOTS, *, block_ms: int = BLOCK_MS) -> None:
        self.reader = reader
        self.start = start
        self.slots = slots
        self.block_ms = block_ms
        self.pool = ThreadPoolExecutor(slots, thread_name_prefix="start")
        self.lock = threading.Condition()
        self.running = 0  # starts handed to the pool and not yet returned
        self.in_hand: dict[str, int] = {}  # entry id -> its starts not yet returned
        self.failed: set[str] = set()  # entries in hand with a start that raised

    def run(self, stop: threading.Event) -> None:
        """Start what comes, until `stop` is set."""
        recover_at = 0.0
        while not stop.is_set():
            try:
                if time.monotonic() >= recover_at:
                    self.recover()  # its first read joins the group if there is none
                    recover_at = time.monotonic() + RECOVER_SECONDS
                self.take_once(stop)
            except redis.RedisError as error:
                log.warning("starts of this node not read: %s", error)
                stop.wait(RETRY_SECONDS)
                recover_at = 0.0
            except Exception:
                log.exception("starts of this node not read")
                stop.wait(RETRY_SECONDS)
                recover_at = 0.0
        self.pool.shutdown(wait=False)

    def take_once(self, stop: threading.Event) -> None:
        """Wait for a free slot, then take what waits (at most one read's worth)."""
        with self.lock:
            while self.running >= self.slots and not stop.is_set():
                self.lock.wait(1.0)
            free = self.slots - self.running
        if stop.is_set():
            return
        self.hand_out(self.reader.take(free, self.block_ms))

    def recover(self) -> None:
        """Hand out again the pending entries not in hand: a predecessor's, or
        this feed's whose start failed."""
        after = "0"
        while True:
            entries = self.reader.pending(100, after)
            if not entries:
                return
            with self.lock:
                fresh = [e for e in entries if e.id not in self.in_hand]
            if fresh:
                log.info("starting again %d start entries left pending", len(fresh))
            self.hand_out(fresh)
            after = entries[-1].id

    def hand_out(self, entries: list[Entry]) -> None:
        empty = [e.id for e in entries if not e.tasks]
        self.reader.done(empty)  # trimmed while pending, or unreadable: nothing to start
        for entry in entries:
            if not entry.tasks:
                continue
            with self.lock:
                self.in_hand[entry.id] = len(entry.tasks)
                self.running += len(entry.tasks)
                self.lock.notify_all()
            for task in entry.tasks:
                self.pool.submit(self._start, entry.id, task)

    def _start(self, entry_id: str, task: StartRef) -> None:
        ok = True
        try:
            self.start(*task)
        except Exception:
            ok = False
            log.exception("start of %s attempt %d %s[%d] failed: left pending", *task)
        with self.lock:
            self.running -= 1
            self.in_hand[entry_id] -= 1
            if not ok:
                self.failed.add(entry_id)
            finished = self.in_hand[entry_id] == 0
            if finished:
                del self.in_hand[entry_id]
                failed = entry_id in self.failed
                self.failed.discard(entry_id)
            self.lock.notify_all()
        if finished and not failed:
            try:
                self.reader.done([entry_id])
            except redis.RedisError as error:  # read again from pending: it starts nothing twice
                log.warning("start entry %s not acknowledged: %s", entry_id, error)
