"""Deterministic interleavings for race tests, on a real Redis.

`Interleaved` wraps a client (and the pipelines it makes) and runs a hook
once, at a chosen point of the code under test: right after a command that
reads a key returned, or right before a command that writes a key is sent
(or queued, inside MULTI). The hook does its work on its own connection, so
the code under test meets exactly the interleaving a slower writer would,
every time, with no sleeps: a plain read-then-write loses the race in every
run, a compare-and-set re-reads and gets it right in every run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis

READS = frozenset({"get", "exists", "hget", "hgetall", "hmget", "hexists", "zrange",
                   "zrangebyscore", "zscore", "mget"})
WRITES = frozenset({"set", "delete", "hset", "hdel", "zadd", "zrem", "xadd", "expire"})
# A script reads and may write every key it names: hooks meet it as both
SCRIPTS = frozenset({"evalsha", "eval"})


@dataclass
class Hook:
    """Run `action` once: after a read of `key` returns, or before a write of it."""

    when: str  # "after-read" | "before-write"
    key: str
    action: Callable[[], Any]
    fired: bool = False


@dataclass
class _Hooks:
    hooks: list[Hook] = field(default_factory=list)

    def run(self, when: str, command: str, args: tuple[Any, ...]) -> None:
        commands = (READS if when == "after-read" else WRITES) | SCRIPTS
        if command not in commands or not args:
            return
        if command in SCRIPTS:  # evalsha(sha, numkeys, *keys, *args)
            keys = list(args[2:2 + int(args[1])])
        else:
            keys = args[0] if isinstance(args[0], list) else [args[0]]
        for hook in self.hooks:
            if not hook.fired and hook.when == when and hook.key in keys:
                hook.fired = True
                hook.action()


class Interleaved:
    """A Redis client or pipeline whose commands run the hooks around them."""

    def __init__(self, target: Any, *hooks: Hook, shared: _Hooks | None = None) -> None:
        self._target = target
        self._hooks = shared or _Hooks(list(hooks))

    @property
    def hooks(self) -> list[Hook]:
        return self._hooks.hooks

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name == "pipeline":
            return lambda *a, **kw: Interleaved(attr(*a, **kw), shared=self._hooks)
        if not callable(attr) or name not in READS | WRITES | SCRIPTS:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self._hooks.run("before-write", name, args)
            result = attr(*args, **kwargs)
            self._hooks.run("after-read", name, args)
            return result

        return call

    def __enter__(self) -> Interleaved:
        self._target.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._target.__exit__(*exc)


def with_hooks(client: redis.Redis, *hooks: Hook) -> redis.Redis:
    """`client`, running `hooks`: a drop-in for the code under test."""
    return cast(redis.Redis, Interleaved(client, *hooks))
