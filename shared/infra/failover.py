"""Riding through a Redis primary switch (Sentinel failover;
docs/design.md, "Redis and Celery").

When Sentinel promotes a replica, every connection to the old primary breaks
and, for a few seconds, the sentinels still name the dead server. A command
caught in that window fails with a connection error, and whether it ran is
unknown when the error came after it was sent. So a client made here
repeats a command only when running it twice leaves Redis as running it once
(reads, and writes such as HSET or ZADD that set a value rather than change
one), waiting with a growing back-off until the new primary answers or
FAILOVER_WAIT_SECONDS have passed. Anything else (INCR, XADD, a Lua script,
an unwatched MULTI) fails at once, as it does on a single Redis: the API
answers 503 with Retry-After, a service's periodic pass repairs it.

Compare-and-set transactions need no list: redis-py turns a connection error
under WATCH into a WatchError (the transaction did not commit, or committed
and is seen on the re-read), and `Store.transact` re-runs the decision on
fresh data through `FailoverWait`.

redis-py's own retry (which repeats any command, INCR included) is switched
off for these clients: this module is the only place that decides.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.client import Pipeline
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from shared.infra import links, packing
from shared.infra.redisurl import SentinelTarget

T = TypeVar("T")

# Long enough for Sentinel to notice a dead primary (the deployments here set
# down-after-milliseconds to 5000) and promote a replica; short enough that
# an API request gives up with a 503 while its client is still waiting.
FAILOVER_WAIT_SECONDS = 20.0
FIRST_PAUSE_SECONDS = 0.05
LONGEST_PAUSE_SECONDS = 1.0
SENTINEL_TIMEOUT_SECONDS = 1.0
CONNECT_TIMEOUT_SECONDS = 2.0
SWITCH_ERRORS = (redis.ConnectionError, redis.TimeoutError)

# Commands whose repeat is harmless: reads, and writes that set rather than
# change (a second HSET of the same value, ZADD of the same score, DEL of a
# deleted key leave what the first left). Not here: INCR*, XADD, LPUSH/RPUSH,
# pops, EVAL*, EXEC, SET with NX/XX/GET (a repeat answers differently).
REPEATABLE = frozenset({
    # reads
    "PING", "EXISTS", "TYPE", "TTL", "PTTL", "GET", "MGET", "STRLEN",
    "HGET", "HMGET", "HGETALL", "HKEYS", "HVALS", "HLEN", "HEXISTS", "HSCAN",
    "SMEMBERS", "SISMEMBER", "SMISMEMBER", "SCARD", "SSCAN",
    "ZRANGE", "ZREVRANGE", "ZRANGEBYSCORE", "ZREVRANGEBYSCORE", "ZSCORE", "ZMSCORE",
    "ZCARD", "ZCOUNT", "ZRANK", "ZREVRANK", "ZSCAN",
    "LRANGE", "LLEN", "LINDEX", "XRANGE", "XREVRANGE", "XLEN", "XREAD", "XINFO",
    "SCAN",
    # writes that set a value
    "SET", "MSET", "HSET", "HMSET", "HDEL", "SADD", "SREM", "ZADD", "ZREM",
    "ZREMRANGEBYSCORE", "DEL", "UNLINK", "EXPIRE", "PEXPIRE", "EXPIREAT", "PEXPIREAT",
    "PERSIST",
})
# Flags that make an otherwise repeatable write answer (or act) differently
# the second time: SET NX succeeds once, ZADD INCR adds twice.
UNREPEATABLE_FLAGS = {"SET": {"NX", "XX", "GET"}, "ZADD": {"INCR", "NX", "XX", "GT", "LT"}}


def repeatable(args: Sequence[Any]) -> bool:
    """Whether the command `args` (as redis-py sends it) may be sent again
    after a connection error left its fate unknown."""
    if not args:
        return False
    name = str(args[0]).upper()
    if name not in REPEATABLE:
        return False
    flags = UNREPEATABLE_FLAGS.get(name)
    return not flags or not any(isinstance(a, str) and a.upper() in flags for a in args[1:])


class FailoverWait:
    """The back-off of one call across a primary switch: `pause()` sleeps the
    next step and says whether the caller may try again (False once the
    budget is spent). Pure bookkeeping over an injectable clock and sleep."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.clock, self.sleep = clock, sleep
        self.deadline = clock() + seconds
        self.step = FIRST_PAUSE_SECONDS

    def pause(self) -> bool:
        left = self.deadline - self.clock()
        if left <= 0:
            return False
        self.sleep(min(self.step, left))
        self.step = min(self.step * 2, LONGEST_PAUSE_SECONDS)
        return True


def failover_seconds(client: Any) -> float:
    """How long `client` waits out a primary switch: zero for a client of a
    single Redis, whose errors surface at once as they always have."""
    return FAILOVER_WAIT_SECONDS if isinstance(client, (FailoverRedis, FailoverPipeline)) \
        else 0.0


def ride_through(call: Callable[[], T], seconds: float) -> T:
    """`call()`, repeated on a connection error until it answers or `seconds`
    have passed (then the last error is raised)."""
    wait = FailoverWait(seconds)
    while True:
        try:
            return call()
        except SWITCH_ERRORS:
            if not wait.pause():
                raise


class FailoverPipeline(Pipeline):
    """A pipeline that repeats a batch across a switch when every command in
    it is repeatable and it is not part of a WATCH transaction (those are
    `Store.transact`'s to repeat, with a fresh read)."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = list(self.command_stack)
        if self.watching or not all(repeatable(args) for args, _ in stack):
            return super().execute(raise_on_error)

        def once() -> list[Any]:
            self.command_stack = list(stack)  # a failed execute() resets the pipeline
            return super(FailoverPipeline, self).execute(raise_on_error)

        return ride_through(once, FAILOVER_WAIT_SECONDS)


class FailoverRedis(redis.Redis):
    """A client of the primary Sentinel names, that waits out a switch for
    repeatable commands (module docstring)."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if not repeatable(args):
            return super().execute_command(*args, **options)
        return ride_through(lambda: super(FailoverRedis, self).execute_command(*args, **options),
                            FAILOVER_WAIT_SECONDS)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> FailoverPipeline:
        return FailoverPipeline(self.connection_pool, self.response_callbacks, transaction,
                                shard_hint)


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel's pool (connections go to the primary it names, and drop when
    it names another) with the blocking pool's wait for a free connection,
    which the single-Redis client has too (store.connect)."""


def sentinel_client(target: SentinelTarget, *, pool_size: int,
                    pool_wait_seconds: float) -> FailoverRedis:
    """A client of `target`'s primary. The sentinels and the Redis servers take
    the same login (the platform's ACL user on each, docs/high-availability.md)."""
    login = {"username": target.username, "password": target.password}
    manager = Sentinel(
        list(target.sentinels),
        sentinel_kwargs={**login, "socket_timeout": SENTINEL_TIMEOUT_SECONDS,
                         "socket_connect_timeout": SENTINEL_TIMEOUT_SECONDS},
    )
    client = manager.master_for(
        target.master, redis_class=FailoverRedis, connection_pool_class=BlockingSentinelPool,
        db=target.db, **login, decode_responses=True,
        **{**links.redis_options(), "socket_connect_timeout": CONNECT_TIMEOUT_SECONDS},
        **packing.options(),
        max_connections=pool_size, timeout=pool_wait_seconds,
        retry=Retry(NoBackoff(), 0))
    assert isinstance(client, FailoverRedis)
    return client
