"""The Redis store: the platform's system of record, and the only way
services touch Redis.

Reads work on a plain client or on a pipeline in WATCH mode (both run
commands at once), so the same readers serve optimistic transactions.
Writers take a pipeline in MULTI mode. `Store.transact` runs a read-decide-
write function under WATCH and retries it on conflict: every state change
goes through it, so two writers can never both win.

This package holds `Store`, made of one part per concept, each a module:
jobs (records, queue places, events), tasks (attempts and their tasks),
listing (many jobs at once, the feed of changes), nodes (nodes and their
allocations, the pass's snapshot) and logs; codec is the JSON text they
write. Here is what every part stands on: the client, the transaction
helper (`transact`, `Expect`, `Contention`), the errors and the one way
to run a Lua script (shared/state/scripts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.client import NEVER_DECODE

from shared.domain.archive import Archive
from shared.domain.models import Job, Task
from shared.infra import links, packing
from shared.infra.config import parse_sentinel_url
from shared.infra.failover import SWITCH_ERRORS, FailoverWait, failover_seconds, sentinel_client
from shared.state import keys, scripts
from shared.state.jobtable import JobTable

T = TypeVar("T")

MAX_TRANSACTION_RETRIES = 200


class StoreError(RuntimeError):
    pass


class JobConflict(StoreError):
    """A job of that name already exists for that user."""


class JobNotFound(StoreError):
    pass


class NodeNotFound(StoreError):
    """No node of that name ever reported."""


class Contention(StoreError):
    """A transaction lost its compare-and-set too many times in a row."""


class ExpectationFailed(StoreError):
    """Something a write was decided on changed before it: nothing was
    written; decide again on fresh reads."""


@dataclass(frozen=True)
class Expect:
    """One condition a conditional write holds to, checked atomically with it."""

    kind: str  # "equal" | "absent" | "below"
    key: str
    field: str = ""
    value: str = ""

    @classmethod
    def field_equals(cls, key: str, field: str, value: str) -> Expect:
        """The hash `key` has `field` set to exactly `value`."""
        return cls("equal", key, field, value)

    @classmethod
    def key_absent(cls, key: str) -> Expect:
        return cls("absent", key)

    @classmethod
    def number_below(cls, key: str, value: int) -> Expect:
        """The string `key` holds a number below `value` (a missing key is 0)."""
        return cls("below", key, value=str(value))


POOL_SIZE = 100  # redis-py's default
POOL_WAIT_SECONDS = 20.0


def connect(url: str, pool_size: int = POOL_SIZE) -> redis.Redis:
    """A client whose callers wait for a free connection rather than fail.

    Under the API's gevent workers hundreds of requests may want Redis at
    once; past `pool_size` connections they queue (up to POOL_WAIT_SECONDS)
    instead of getting redis-py's "Too many connections", which was a 500.
    A `redis+sentinel://` URL gives a client that follows the primary the
    sentinels name and waits out a switch (shared/infra/failover.py).
    """
    target = parse_sentinel_url(url)
    if target is not None:
        return sentinel_client(target, pool_size=pool_size, pool_wait_seconds=POOL_WAIT_SECONDS)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=pool_size, timeout=POOL_WAIT_SECONDS,
        decode_responses=True, **links.redis_options(), **packing.options())
    client = redis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # close() closes the pool, as from_url's does
    return client


def dedicated(client: redis.Redis) -> redis.Redis:
    """A client that holds one connection of `client`'s pool until its
    `close()`, for one caller sending command after command (a terminal
    session's pump): no check-out and check-in of the pool around each.
    Its class is `client`'s, so a failover client stays one."""
    return type(client)(connection_pool=client.connection_pool, single_connection_client=True)


# redis-py types every reply as a union of bytes, str and awaitables, which
# helps no one here (the client decodes replies): a pipeline or client is Any.
Pipe = Any
Reader = Any


class StoreCore:
    """The client and what every concept's part of `Store` runs on."""

    def __init__(self, client: redis.Redis) -> None:
        self.r: Any = client
        self._table: JobTable | None = None

    # ------------------------------------------------------------ transactions

    def transact(self, fn: Callable[[Pipe], T], *watch: str) -> T:
        """Run `fn` under WATCH on `watch` (fn may WATCH more before MULTI).

        `fn` reads through the pipeline, calls `pipe.multi()`, queues its
        writes and returns; the writes commit only if nothing watched changed
        since it was read, else `fn` runs again on fresh data. On a Sentinel
        client a connection lost during a primary switch is waited out and
        `fn` runs again too: before EXEC nothing was written, and a lost EXEC
        under WATCH comes back from redis-py as a WatchError, so the re-run
        decides on what the new primary holds. Only an EXEC with nothing
        watched has an unknown outcome: that error is raised.
        """
        switch = FailoverWait(failover_seconds(self.r))
        with self.r.pipeline() as pipe:
            for _ in range(MAX_TRANSACTION_RETRIES):
                executing = False
                try:
                    if watch:
                        pipe.watch(*watch)
                    result = fn(pipe)
                    if pipe.explicit_transaction:
                        executing = not pipe.watching
                        pipe.execute()
                    else:
                        pipe.unwatch()
                    return result
                except redis.WatchError:
                    pipe.reset()
                    continue
                except SWITCH_ERRORS:
                    pipe.reset()
                    if executing or not switch.pause():
                        raise
        raise Contention(f"gave up after {MAX_TRANSACTION_RETRIES} conflicting writes on {watch}")

    def run_script(self, script: scripts.Script, script_keys: Sequence[str],
                   args: Sequence[Any]) -> Any:
        """Run one of shared/state/scripts' Lua scripts (atomic: nothing
        else runs in Redis meanwhile) on this store's client. Its keys are
        named in `script_keys`, so they show in the call as any command's do."""
        return scripts.run(self.r, script, script_keys, args)

    def pipeline(self, *, atomic: bool) -> Pipe:
        """A pipeline for the state layer's writers (the functions that take a
        `pipe`) to queue into: `execute()` sends it in one round trip, as one
        MULTI/EXEC when `atomic` (a write and its audit land together)."""
        return self.r.pipeline(transaction=atomic)

    def ping(self) -> bool:
        """Whether Redis answers (raises when it does not)."""
        return bool(self.r.ping())

    def memory_used_bytes(self) -> int:
        """What Redis has allocated (its MEMORY STATS total)."""
        return int(self.r.memory_stats()["total.allocated"])

    def read_archive(self, reader: Reader, job_id: str) -> Archive | None:
        """A compacted job's archive (shared/domain/archive.py), or None: every
        part's readers fall back to it, so a job reads the same before and
        after."""
        blob = reader.execute_command("GET", keys.job_archive(job_id), **{NEVER_DECODE: True})
        return Archive.decode(blob) if blob else None


# The parts, by concept: imported after StoreCore, which each one extends.
from shared.state.store.codec import compact_json, event_fields, plain_json  # noqa: E402
from shared.state.store.jobs import EVENTS_MAX_LEN, JobsMixin  # noqa: E402
from shared.state.store.listing import READ_MANY, SORT_READ_CHUNK, ListingMixin  # noqa: E402
from shared.state.store.logs import LogsMixin  # noqa: E402
from shared.state.store.nodes import (  # noqa: E402
    MAX_GONE_ALLOCATIONS,
    MAX_KNOWN_ALLOCATIONS,
    NodesMixin,
    QueuedJob,
    Snapshot,
)
from shared.state.store.tasks import TasksMixin, _in_task_order, task_is_live  # noqa: E402

JOB_VIEW_TRIES = 3  # Store.job_with_tasks: reads of a job whose attempt keeps moving


class Store(JobsMixin, TasksMixin, ListingMixin, NodesMixin, LogsMixin):
    """Every concept's reads and writes on one client."""

    def job_with_tasks(self, job: Job) -> tuple[Job, list[Task]]:
        """The job's record and its current attempt's tasks as of one moment
        (`read_job_view`: one script call), for a view that must not show,
        say, a WAITING job with a RUNNING task. `job` as read before names
        the attempt; read again until the record names the same one (a few
        tries: a job that moves on faster is shown as last read, its tasks
        read after it). A compacted job's tasks come from its archive."""
        for _ in range(JOB_VIEW_TRIES):
            view = self.read_job_view(self.r, job.id, job.attempt)
            if view.job is None:
                return job, self.get_tasks(job.id, job.attempt)
            asked, job = job.attempt, view.job
            if job.attempt == asked:
                if view.tasks:
                    return job, _in_task_order(view.tasks.values())
                break
        return job, self.get_tasks(job.id, job.attempt)

    @classmethod
    def from_url(cls, url: str) -> Store:
        return cls(connect(url))


__all__ = [
    "EVENTS_MAX_LEN", "MAX_GONE_ALLOCATIONS", "MAX_KNOWN_ALLOCATIONS", "MAX_TRANSACTION_RETRIES",
    "POOL_SIZE", "POOL_WAIT_SECONDS", "READ_MANY", "SORT_READ_CHUNK", "Contention", "Expect",
    "ExpectationFailed", "JobConflict", "JobNotFound", "NodeNotFound", "Pipe", "QueuedJob",
    "Reader", "Snapshot", "Store", "StoreCore", "StoreError", "compact_json", "connect",
    "event_fields", "plain_json", "task_is_live",
]
