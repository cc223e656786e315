"""The cyclic garbage collector around the scheduler's passes.

A pass allocates an object or more per queued job and makes no reference
cycles; refcounting frees all of it. Two rules keep the collector's walks of
the whole heap out of the passes:

- **Paused inside** (`paused_gc`): every so many allocations the collector
  walks every tracked object, the queue included, which made a pass over
  50,000 jobs grow faster than the queue (docs/performance-log.md).
- **Survivors frozen after a pass** (`paused_gc(freeze_survivors=True)`, the
  service's pass): what a pass keeps (its caches of parsed specs, requests,
  records and allocations: a million objects at 100,000 queued jobs) is
  moved to the collector's permanent generation before the collector is
  back on. Otherwise the collector's next runs walk all of it, for nothing
  since it holds no cycles: 0.7 s right after a first pass at 10,000 nodes,
  then 0.7 and 0.9 s more before the next.

  A frozen object is still freed by refcounting when dropped; only a cycle
  frozen before it was collected outlives its last reference. So every
  THAW_SECONDS a pass's end unfreezes everything and collects once: a cycle
  anything in the process made lives at most that long.

Nested and threaded uses are safe: the collector is back on when the last
pauser leaves, if it was on before, and the freeze is done by that last one
when any pauser of the span asked for it.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

THAW_SECONDS = 600.0  # how long a frozen cycle may outlive its last reference

_lock = threading.Lock()
_pausers = 0
_was_enabled = False
_freeze_asked = False
_thawed_at = time.monotonic()


@contextmanager
def paused_gc(*, freeze_survivors: bool = False) -> Iterator[None]:
    """No cyclic garbage collection inside; with `freeze_survivors`, what
    is left allocated afterwards is frozen (the module's doc)."""
    global _pausers, _was_enabled, _freeze_asked
    with _lock:
        if _pausers == 0:
            _was_enabled = gc.isenabled()
            _freeze_asked = False
            gc.disable()
        _pausers += 1
        _freeze_asked = _freeze_asked or freeze_survivors
    try:
        yield
    finally:
        with _lock:
            _pausers -= 1
            if _pausers == 0 and _was_enabled:
                if _freeze_asked:
                    _settle(time.monotonic())
                gc.enable()


def _settle(now: float) -> None:
    """Freeze what is tracked now; first, when THAW_SECONDS have passed since
    the last time, unfreeze and collect everything once."""
    global _thawed_at
    if now - _thawed_at >= THAW_SECONDS:
        gc.unfreeze()
        started = time.perf_counter()
        found = gc.collect()
        log.info("heap thawed: %d unreachable objects collected in %.0f ms", found,
                 (time.perf_counter() - started) * 1000)
        _thawed_at = now
    gc.freeze()
