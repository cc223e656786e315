"""Handlers run in order per key, in parallel across keys."""

from __future__ import annotations

import threading
import time
from functools import partial

import pytest

from services.monitor.dispatch import DispatcherClosed, KeyedDispatcher, backoff_delay

WAIT = 10.0


def test_one_key_runs_in_order() -> None:
    dispatcher = KeyedDispatcher(max_workers=4)
    seen: list[int] = []
    try:
        futures = [dispatcher.submit("c1", partial(seen.append, i)) for i in range(200)]
        for future in futures:
            future.result(WAIT)
    finally:
        dispatcher.shutdown()
    assert seen == list(range(200))


def test_a_slow_key_does_not_block_another() -> None:
    dispatcher = KeyedDispatcher(max_workers=2)
    release = threading.Event()
    try:
        slow = dispatcher.submit("slow", lambda: release.wait(WAIT))
        fast = dispatcher.submit("fast", lambda: "done")
        assert fast.result(WAIT) == "done"
        assert not slow.done()
        release.set()
        assert slow.result(WAIT) is True
    finally:
        release.set()
        dispatcher.shutdown()


def test_keys_never_overlap_with_themselves() -> None:
    dispatcher = KeyedDispatcher(max_workers=8)
    running: dict[str, int] = {}
    overlaps: list[str] = []
    lock = threading.Lock()

    def work(key: str) -> None:
        with lock:
            running[key] = running.get(key, 0) + 1
            if running[key] > 1:
                overlaps.append(key)
        time.sleep(0.001)
        with lock:
            running[key] -= 1

    try:
        futures = [dispatcher.submit(f"k{i % 3}", partial(work, f"k{i % 3}")) for i in range(90)]
        for future in futures:
            future.result(WAIT)
    finally:
        dispatcher.shutdown()
    assert overlaps == []


def test_a_failure_is_on_the_future_and_the_key_goes_on() -> None:
    dispatcher = KeyedDispatcher(max_workers=1)

    def boom() -> None:
        raise RuntimeError("boom")

    try:
        failed = dispatcher.submit("k", boom)
        after = dispatcher.submit("k", lambda: 42)
        with pytest.raises(RuntimeError, match="boom"):
            failed.result(WAIT)
        assert after.result(WAIT) == 42
        assert dispatcher.pending() == 0
    finally:
        dispatcher.shutdown()


def test_submit_after_shutdown_is_refused() -> None:
    dispatcher = KeyedDispatcher(max_workers=1)
    dispatcher.shutdown()
    with pytest.raises(DispatcherClosed):
        dispatcher.submit("k", lambda: None)


def test_shutdown_cancels_what_is_queued() -> None:
    dispatcher = KeyedDispatcher(max_workers=1)
    started, release = threading.Event(), threading.Event()

    def first() -> None:
        started.set()
        release.wait(WAIT)

    running = dispatcher.submit("k", first)
    queued = dispatcher.submit("k", lambda: "never")
    assert started.wait(WAIT)
    threading.Timer(0.05, release.set).start()
    dispatcher.shutdown(wait=True)
    assert running.done() and not running.cancelled()
    assert queued.cancelled()


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 0.0), (1, 0.5), (2, 1.0), (3, 2.0), (5, 8.0), (6, 10.0), (1000, 10.0)],
)
def test_backoff_delay(failures: int, expected: float) -> None:
    assert backoff_delay(failures, base=0.5, cap=10.0) == expected
