"""The cluster's clock, as this process reads it: epoch milliseconds.

Every host's services stamp records (createdTime, a task's start and end, a
usage interval, a terminal session's last use) and compare stamps others
wrote. Hosts' clocks disagree, so each process keeps the offset between its
own wall clock and the control plane's (Redis's TIME), measured by
shared/state/clock.py, and `now_ms` applies it: a node whose clock is minutes
off still stamps the cluster's time. Until the first measurement (or
without Redis) the offset is 0. Durations measured on one host use
`time.monotonic`, never this.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_offset_ms = 0


def now_ms() -> int:
    return int(time.time() * 1000) + _offset_ms


def offset_ms() -> int:
    return _offset_ms


def set_offset_ms(offset: int) -> None:
    global _offset_ms
    with _lock:
        _offset_ms = offset
