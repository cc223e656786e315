"""Caps on log follows: per user across every API process, and per process.

A follow is a stream that stays open until the task ends, so without a cap
one user could hold every connection the API has. Each follow holds a lease
in Redis (keys.follow_leases: lease id -> expiry), so the cap holds across
processes and replicas; the follow renews its lease while it runs and drops
it before its end event, or when the response closes (its client gone). A
lease whose process died is not renewed and stops counting when it expires.
Beyond the cap: 429 with `Retry-After`.

Each process also keeps at most half of its connections for follows, so
that requests always find a free connection however many users follow, and
follows read Redis through a pool of their own, one connection per follow
slot: a log's reader waits on Redis (XREAD BLOCK) holding a connection, and
must not take the ones requests need. Followers of one log share one reader
(services/api/loghub.py).
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from flask import Flask

from services.api.errors import ApiError
from services.api.loghub import LogHub
from services.api.platform import extension_of
from shared.infra.clock import now_ms as cluster_now_ms
from shared.infra.config import Settings
from shared.state import followleases, keys
from shared.state.store import Store, connect

LEASE_SECONDS = 30.0
RENEW_SECONDS = LEASE_SECONDS / 3
RETRY_AFTER_SECONDS = 5  # about when a closed follow's lease is given back
EXTENSION = "pai.follows"


class FollowRefused(ApiError):
    """No follow (or exec, terminal, proxied connection) now: 503 when this
    process serves as many as it may, 429 past the user's cap; either way the
    client is told when to try again."""

    def __init__(self, message: str, status: int = 429) -> None:
        code = "TooManyRequestsError" if status == 429 else "ServiceUnavailableError"
        super().__init__(code, message, status,
                         headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


@dataclass
class _ProcessSlots:
    """Follows open in this process, bounded; a lock because threads may serve them."""

    limit: int
    used: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> bool:
        with self.lock:
            if self.used >= self.limit:
                return False
            self.used += 1
            return True

    def give_back(self) -> None:
        with self.lock:
            self.used = max(0, self.used - 1)


class FollowLeases:
    """Leases of one user's follows in Redis; every write is a conditional
    script (the check and the write are one step). Other per-user caps (execs,
    services/api/execs.py) use the same leases under their own key."""

    def __init__(self, store: Store, per_user: int, *,
                 key: Callable[[str], str] = keys.follow_leases,
                 lease_seconds: float = LEASE_SECONDS) -> None:
        self.store, self.per_user = store, per_user
        self.key, self.lease_seconds = key, lease_seconds

    def acquire(self, username: str, now: float | None = None) -> str | None:
        """A new lease id, or None when the user holds `per_user` live leases."""
        ask = self.ask(username, now)
        return ask.lease if self.take(ask) else None

    def ask(self, username: str, now: float | None = None) -> followleases.Lease:
        """A new lease for `username`, not yet taken: `take` takes it alone, a
        write beside it takes it with its writes (shared/state/gated.py)."""
        now_ms = cluster_now_ms() if now is None else _ms(now)
        return followleases.Lease(self.key(username), uuid.uuid4().hex, now_ms,
                                  now_ms + _ms(self.lease_seconds), self.per_user)

    def take(self, ask: followleases.Lease) -> bool:
        """Take the lease `ask` names alone: False when the user holds the cap."""
        return followleases.acquire(self.store, ask)

    def renew(self, username: str, lease: str, now: float | None = None) -> bool:
        """Extend the lease; False when it is gone (expired and dropped, or released)."""
        now_ms = cluster_now_ms() if now is None else _ms(now)
        return followleases.renew(self.store, self.key(username), lease, now_ms,
                                  now_ms + _ms(self.lease_seconds))

    def release(self, username: str, lease: str) -> None:
        """Give the lease back (the follow's own member; nothing else is touched)."""
        followleases.release(self.store, self.key(username), lease)


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


@dataclass
class Caps:
    """The two caps on one kind of long-held request (log follows, execs,
    terminals, proxied connections), and what a refusal by each says: the
    user's `leases` across every API process (429 past the cap, `capped`
    formatted with {user} and {cap}) and this process's `slots` (503 when all
    are taken, `busy`)."""

    leases: FollowLeases
    slots: _ProcessSlots
    busy: str
    capped: str

    def open(self, username: str,
             take: Callable[[followleases.Lease], bool] | None = None) -> str:
        """A slot and a lease (its id) for one more request by `username`, until
        `close`; or FollowRefused. `take` takes the lease (by default alone)
        and says whether it did, as shared/state/gated.py `write` does for a
        lease taken with writes beside it."""
        if not self.slots.take():
            raise FollowRefused(f"{self.busy}; try again shortly", 503)
        try:
            ask = self.leases.ask(username)
            taken = take(ask) if take is not None else self.leases.take(ask)
        except BaseException:
            self.slots.give_back()
            raise
        if not taken:
            self.slots.give_back()
            raise FollowRefused(self.capped.format(user=username, cap=self.leases.per_user))
        return ask.lease

    def close(self, username: str, lease: str, *, returned: bool = False) -> None:
        """Give back the slot, and the lease unless it was `returned` already
        (an exec's answer gives it back: shared/state/execs.py)."""
        try:
            if not returned:
                self.leases.release(username, lease)
        finally:
            self.slots.give_back()

    def hold(self, username: str) -> Held:
        """`open`, as a Held that gives back once."""
        return Held(self, username, self.open(username))

    @contextlib.contextmanager
    def held(self, username: str) -> Iterator[str]:
        """`open` for the block (the lease id), then `close`."""
        lease = self.open(username)
        try:
            yield lease
        finally:
            self.close(username, lease)


@dataclass
class Held:
    """One request's slot and lease (`Caps.hold`), for a request that may end
    on more than one path: `close` gives them back once, however often it is
    called (a stream gives them back before its last frame, so that a client
    may open the next at once, and its response's close does again)."""

    caps: Caps
    username: str
    lease: str
    closed: bool = False

    def renew(self) -> bool:
        """Extend the lease; False when it is gone."""
        return self.caps.leases.renew(self.username, self.lease)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.caps.close(self.username, self.lease)


@dataclass
class Follows(Caps):
    """What a follow view needs: the follows' caps, and the process's one
    reader of each log followed."""

    busy: str = "this API process serves as many log follows as it may"
    capped: str = ("{user} already follows {cap} logs, the most one user may; close one or "
                   "try again later")
    hub: LogHub = field(init=False)

    def __post_init__(self) -> None:
        self.hub = LogHub(self.leases.store)

    @property
    def store(self) -> Store:
        """The follows' own Redis pool (see the module's docstring)."""
        return self.leases.store


def follows_of(app: Flask, settings: Settings) -> Follows:
    """The app's Follows, made on first use (one per process, as the app is)."""
    def create() -> Follows:
        slots = max(1, settings.api_worker_connections // 2)
        store = Store(connect(settings.redis_url, pool_size=slots))
        return Follows(FollowLeases(store, settings.api_follows_per_user), _ProcessSlots(slots))

    return extension_of(app, EXTENSION, create)
