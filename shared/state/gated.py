"""A batch of writes held to what it was decided on, and to one more lease
of a user's: one script call (scripts.LEASED_WRITE), so a request whose
writes need a fresh token check and a free lease first (an exec,
services/api/execs.py) makes one round trip for all three, not three.

The writes are queued by the state layer's usual writers (the functions
that take a `pipe`) onto a `Writes`, which records the commands as
redis-py builds them instead of sending them; the script runs them in
order. Only a command whose one key is its first argument may be queued.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from redis.commands import CoreCommands
from redis.connection import Encoder

from shared.state import scripts
from shared.state.followleases import Lease
from shared.state.store import Expect, ExpectationFailed, Store

# The commands a batch may hold: each names one key, its first argument.
ONE_KEY_WRITES = frozenset({"HSET", "HINCRBY", "HINCRBYFLOAT", "EXPIRE", "PEXPIRE", "SET",
                            "XADD", "ZADD", "ZREM", "SADD", "SREM", "RPUSH", "LPUSH"})
# Lua's unpack takes at most about 8,000 values at once (CREATE_JOB cuts its
# HSET in pieces for this); a batch's writes are small.
MAX_ARGUMENTS = 4_000

_ENCODER = Encoder("utf-8", "strict", decode_responses=False)


class Writes(CoreCommands):
    """Writes queued as onto a pipeline, kept for the script: each command
    as redis-py builds it, its arguments as redis-py would send them."""

    _event_dispatcher: Any = None  # redis-py's commands declare it; nothing is sent

    def __init__(self) -> None:
        self.commands: list[list[str]] = []

    def execute_command(self, *args: Any, **_options: Any) -> Writes:
        name = str(args[0]).upper()
        if name not in ONE_KEY_WRITES:
            raise ValueError(f"{name} cannot be held in a batch: only {sorted(ONE_KEY_WRITES)}")
        if len(args) > MAX_ARGUMENTS:
            raise ValueError(f"{name} with {len(args)} arguments is too long for a batch")
        self.commands.append([name, *(_ENCODER.encode(a).decode() for a in args[1:])])
        return self


def write(store: Store, lease: Lease, writes: Callable[[Writes], None],
          expectations: Sequence[Expect] = ()) -> bool:
    """Run what `writes` queues, in one atomic step, if every expectation
    holds and `lease` is taken: True. False when the user holds `cap` leases
    (nothing written); ExpectationFailed when an expectation does not hold
    (nothing written, the lease not taken)."""
    batch = Writes()
    writes(batch)
    items: list[list[str]] = [[e.kind, e.field, e.value] for e in expectations]
    items += [[name, *rest] for name, _key, *rest in batch.commands]
    script_keys = [lease.key, *(e.key for e in expectations),
                   *(key for _name, key, *_rest in batch.commands)]
    outcome = store.run_script(scripts.LEASED_WRITE, script_keys, [
        lease.lease, lease.now_ms, lease.expiry_ms, lease.cap, len(expectations),
        json.dumps(items, ensure_ascii=False, separators=(",", ":"))])
    if outcome == "changed":
        raise ExpectationFailed("what the write was decided on changed")
    return bool(outcome == "written")
