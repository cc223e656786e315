"""A pooled Redis connection's check-out check, without a turn of the event loop.

redis-py checks each connection it takes from a pool for unread data (a
reply left behind, or the server's close) with a zero-timeout `poll`. Under
gevent (the API's workers) `select.poll` is gevent's, which answers even a
zero timeout by starting a watcher and yielding to the hub: a whole turn of
the event loop before every command, 35-40 µs of a 100 µs round trip
(docs/performance-log.md, 2026-11-30, exec keystrokes), and any greenlet
ready meanwhile runs first.

`quick_checkout(pool)` gives the pool connections that ask the operating
system's own `poll` first. A clean connection (the common answer) is then
known clean at once; one with data or closed is checked as redis-py checks
it, so every answer is redis-py's. Outside gevent the two polls are the same
call.
"""

from __future__ import annotations

import select
import sys
from functools import cache
from typing import Any

import redis


@cache
def _os_poll() -> Any:
    """The `select.poll` gevent's monkey-patching replaced, or the one there is
    (the same function either way, so it is looked up once)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("select"):
        return monkey.get_original("select", "poll")
    return select.poll


def _readable_now(sock: Any) -> bool:
    poller = _os_poll()()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _QuickCheck:
    """Mixed in before a redis-py connection class (see the module's doc)."""

    _parser: Any
    _sock: Any

    def can_read(self, timeout: float = 0) -> bool:
        reader = getattr(self._parser, "_reader", None)  # hiredis's reader, when it parses
        sock = self._sock
        if (timeout == 0 and reader is not None and sock is not None
                and not reader.has_data()
                and not (hasattr(sock, "pending") and sock.pending())  # TLS bytes decrypted
                and not _readable_now(sock)):
            return False
        return bool(super().can_read(timeout))  # type: ignore[misc]


@cache
def _quick(connection_class: type) -> type:
    return type(f"Quick{connection_class.__name__}", (_QuickCheck, connection_class), {})


def quick_checkout(pool: redis.ConnectionPool) -> None:
    """The pool's connections, from now on, check out as the module's doc says
    (call it before the pool makes its first)."""
    pool.connection_class = _quick(pool.connection_class)
