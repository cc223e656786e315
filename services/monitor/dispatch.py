"""Run handlers on a small thread pool, in order for any one key.

The monitor handles Docker events and reconcile work off the thread that
reads the event stream, so a slow handler (stopping an orphan, draining a
log) never stalls the stream. Work for one container must still happen in
the order it was seen (its start before its exit): each key gets a queue,
and at most one pool thread drains a key's queue at a time.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

log = logging.getLogger(__name__)


class DispatcherClosed(RuntimeError):
    pass


class KeyedDispatcher:
    def __init__(self, max_workers: int = 8, name: str = "pai-monitor") -> None:
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._queues: dict[str, deque[tuple[Callable[[], Any], Future[Any]]]] = {}
        self._closed = False

    def submit(self, key: str, fn: Callable[[], Any]) -> Future[Any]:
        """Queue `fn` behind earlier work of `key`; its future holds the result.

        A failure is logged here and also set on the future, so nobody has
        to wait on a future just to see it.
        """
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise DispatcherClosed("the dispatcher is shut down")
            queue = self._queues.get(key)
            idle = queue is None
            if queue is None:
                queue = self._queues[key] = deque()
            queue.append((fn, future))
        if idle:
            self._pool.submit(self._drain, key)
        return future

    def pending(self) -> int:
        """How many handlers are queued or running, over every key."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def _drain(self, key: str) -> None:
        while True:
            with self._lock:
                queue = self._queues[key]
                if not queue or self._closed:
                    for _fn, future in queue:
                        future.cancel()
                    del self._queues[key]
                    return
                fn, future = queue[0]
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except Exception as error:
                    log.exception("handler for %s failed", key)
                    future.set_exception(error)
            with self._lock:
                queue.popleft()

    def shutdown(self, wait: bool = True) -> None:
        """Finish what runs now, drop what is queued (reconcile redoes it)."""
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait)


def backoff_delay(failures: int, base: float = 0.5, cap: float = 10.0) -> float:
    """Seconds to wait after `failures` failures in a row: doubling, capped."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(failures - 1, 30)))
