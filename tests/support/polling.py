"""Waiting on a condition, never on a clock: each wait polls with a bound and
fails the test, naming what it waited for, when the bound passes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from shared.infra.clock import now_ms

WAIT_SECONDS = 60.0  # long past any healthy wait on a loaded 2-core machine
POLL_SECONDS = 0.05
T = TypeVar("T")


def wait_for(probe: Callable[[], T], what: str, timeout: float = WAIT_SECONDS) -> T:
    """Poll until `probe` returns something truthy; fail (never hang) after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(POLL_SECONDS)


def wait_past(stamp_ms: int) -> None:
    """Until the clock is past `stamp_ms` (at most a few ms, never a sleep)."""
    for _ in range(10_000_000):
        if now_ms() > stamp_ms:
            return
    raise AssertionError("the clock did not move")
