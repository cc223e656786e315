"""A user's leases of long-held requests in Redis (log follows, execs,
terminals, proxied connections: services/api/follows.py keeps the caps).

One sorted set per user and kind (lease id -> expiry ms); every write that
checks before it writes is one script (shared/state/scripts/follows.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.state import scripts
from shared.state.store import Store


@dataclass(frozen=True)
class Lease:
    """One more lease in a user's set `key`: taken unless the set holds `cap`
    live ones."""

    key: str
    lease: str
    now_ms: int
    expiry_ms: int
    cap: int


def acquire(store: Store, lease: Lease) -> bool:
    """Take `lease` unless its set holds its cap of live ones (expired ones
    dropped); shared/state/gated.py takes one beside other writes."""
    return bool(store.run_script(scripts.ACQUIRE_FOLLOW, [lease.key],
                                 [lease.lease, lease.now_ms, lease.expiry_ms, lease.cap]))


def renew(store: Store, key: str, lease: str, now_ms: int, expiry_ms: int) -> bool:
    """Extend a live lease; False when it is gone (expired and dropped, or released)."""
    return bool(store.run_script(scripts.RENEW_FOLLOW, [key], [lease, now_ms, expiry_ms]))


def release(store: Store, key: str, lease: str) -> None:
    """Give the lease back (its own member; nothing else is touched)."""
    queue_release(store.r, key, lease)


def queue_release(pipe: Any, key: str, lease: str) -> None:
    """`release` on `pipe`, a client or a pipeline (beside the writes that end
    what the lease covered)."""
    pipe.zrem(key, lease)
