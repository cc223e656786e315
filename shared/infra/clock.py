"""This host's wall clock, in the epoch milliseconds the API returns.

Good for what one host stamps and reads back itself (a record's createdTime,
a token's expiry). A comparison across hosts (a node's heartbeat against the
scheduler's now, a lease) must not use it: see shared/state/clock.py.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
