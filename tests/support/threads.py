"""Threads in tests: loops run beside the test, and what the tests read of a
thread's life from Linux."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

JOIN_SECONDS = 30


@contextmanager
def looping(*loops: Callable[[threading.Event], None]) -> Iterator[threading.Event]:
    """Each `loop(stop)` on a thread of its own for the block (a service's feed
    or wake thread, as its process runs it); then `stop` is set and every
    thread must end."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop, args=(stop,), daemon=True) for loop in loops]
    for thread in threads:
        thread.start()
    try:
        yield stop
    finally:
        stop.set()
        for thread in threads:
            thread.join(JOIN_SECONDS)
        assert not any(thread.is_alive() for thread in threads), "a loop did not stop"


def wakeups(thread_id: int) -> int:
    """How many times the thread (a native id in this process) has given up
    the CPU and been woken since it started: its voluntary context switches.
    A thread that polls wakes on every poll; one that blocks, only when woken."""
    status = Path(f"/proc/self/task/{thread_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("voluntary_ctxt_switches")))
