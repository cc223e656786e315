"""Keep this process's clock on the control plane's (shared/infra/clock.py).

The offset is Redis's TIME minus this host's wall clock at the middle of the
round trip, so it is known to within half the round trip. An offset smaller
than OFFSET_FLOOR_MS is taken as none: clocks kept by NTP agree that well,
and a jitter of a millisecond between two measurements must not reorder
stamps written a moment apart on one host.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import redis

from shared.infra import clock

log = logging.getLogger(__name__)

OFFSET_FLOOR_MS = 250
SYNC_SECONDS = 30.0


def measure_offset_ms(r: Any) -> tuple[int, int]:
    """(offset, round trip) in ms: Redis's TIME against this host's clock."""
    before = time.time()
    seconds, micros = r.time()
    after = time.time()
    server = int(seconds) * 1000 + int(micros) // 1000
    return server - int((before + after) * 500), int((after - before) * 1000)


def sync(r: Any) -> int:
    """Measure and apply the offset; the offset now in force."""
    offset, round_trip = measure_offset_ms(r)
    applied = offset if abs(offset) >= max(OFFSET_FLOOR_MS, round_trip) else 0
    if abs(applied - clock.offset_ms()) >= OFFSET_FLOOR_MS:
        log.warning("this host's clock is %+d ms off the control plane's (Redis TIME): "
                    "stamping the control plane's time", -applied)
    clock.set_offset_ms(applied)
    return applied


def sync_quietly(r: Any) -> None:
    """`sync`, where Redis being away is no error (the next sync tries again)."""
    try:
        sync(r)
    except redis.RedisError as error:
        log.debug("clock sync failed: %s", error)


def keep_in_sync(r: Any, stop: threading.Event, interval: float = SYNC_SECONDS) -> None:
    """Sync now and every `interval` seconds until `stop` (a thread's loop)."""
    while True:
        sync_quietly(r)
        if stop.wait(interval):
            return


def start_sync_thread(r: Any, stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=keep_in_sync, args=(r, stop), name="pai-clock-sync",
                              daemon=True)
    thread.start()
    return thread
