"""CPU-heavy calls off the event loop, when the process runs one.

The API serves on gevent workers: every request of a process shares one OS
thread, so a call that holds the CPU for long (an argon2 hash: ~150 ms)
holds every other request of that process too. Such calls run on gevent's
pool of real threads there (argon2 releases the GIL while it works); in any
other process they are plain calls.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from argon2 import PasswordHasher

T = TypeVar("T")


def _gevent_patched() -> bool:
    if "gevent.monkey" not in sys.modules:
        return False
    from gevent import monkey

    return bool(monkey.is_module_patched("threading"))


def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, on gevent's thread pool when this process is patched."""
    if not _gevent_patched():
        return fn(*args)
    import gevent

    result: T = gevent.get_hub().threadpool.apply(fn, args)
    return result


class OffLoopHasher(PasswordHasher):
    """argon2's hasher, hashing and verifying off the event loop."""

    def hash(self, password: str | bytes, *, salt: bytes | None = None) -> str:
        return off_loop(lambda: PasswordHasher.hash(self, password, salt=salt))

    def verify(self, hash: str | bytes, password: str | bytes) -> Literal[True]:
        return off_loop(PasswordHasher.verify, self, hash, password)
