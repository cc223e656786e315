"""The schedulers' doorbell: how a service asks for a pass without a Celery
message.

A pass request carries nothing (a pass reads the whole state), so any number
of requests made before a pass begins need that one pass. The doorbell is a
Redis list of at most one entry (keys.SCHEDULER_WAKE):

- `ring` pushes an entry and trims the list to it, on the ringer's own
  pipeline (two commands, no round trip of their own when the ringer writes
  anyway);
- a scheduler's wake thread (services/scheduler/run.py) takes the entry with
  a blocking pop and asks for a pass through the pass gate
  (services/scheduler/gate.py), which runs one pass at a time across the
  replicas and passes again for what was asked during a pass. A ring during
  a pass leaves an entry, so it gets a pass of its own after it.

A ring costs its ringer and the scheduler a fraction of the Celery message it
replaces (kombu's encoding, the worker's bookkeeping on both sides: the
exit of every short job sent one; docs/performance-log.md, 2026-11-29).
A ring taken by a scheduler killed before its pass is lost; the jobs then wait
for the repair loop's pass, every few seconds, as they do behind a scheduler
of an earlier version that does not listen (it still takes the Celery
message `pai.scheduler.schedule`, which the scheduler keeps handling).

A ring says why, in its entry: CAPACITY (an exit, a GPU back: answered at
once) or NEW_WORK (a submit: a scheduler whose last pass left jobs waiting
may answer it a moment later, services/scheduler/pacing.py). CAPACITY is
pushed at the head and NEW_WORK at the tail, and the trim keeps the head, so
the one entry is CAPACITY whenever either ring asked for it. A scheduler of
an earlier version passes for either; CAPACITY is the entry it knew.
"""

from __future__ import annotations

import time
from typing import Any

from shared.state import keys

KEY = keys.SCHEDULER_WAKE
CAPACITY, NEW_WORK = "1", "new"  # why a ring was made: the entry it leaves


def ring(pipe: Any, *, new_work: bool = False) -> None:
    """Queue on `pipe` a request for a pass; `new_work`: asked only because
    jobs were queued (a CAPACITY ring already there is kept)."""
    if new_work:
        pipe.rpush(KEY, NEW_WORK)
    else:
        pipe.lpush(KEY, CAPACITY)
    pipe.ltrim(KEY, 0, 0)


def ring_now(client: Any, *, new_work: bool = False) -> None:
    """Ask for a pass now: one round trip."""
    pipe = client.pipeline(transaction=False)
    ring(pipe, new_work=new_work)
    pipe.execute()


def wait(client: Any, seconds: float) -> str | None:
    """The ring taken (CAPACITY or NEW_WORK), waiting up to `seconds` for
    one; None if none came."""
    taken = client.blpop([KEY], timeout=seconds)
    if taken is None:
        return None
    entry = taken[1]
    return NEW_WORK if entry in (NEW_WORK, NEW_WORK.encode()) else CAPACITY


# BLPOP reads a timeout of 0 as "for ever": a wait this short is not made
SHORTEST_WAIT_SECONDS = 0.001


def wait_for_capacity(client: Any, seconds: float) -> bool:
    """Whether a CAPACITY ring was taken within `seconds`; NEW_WORK rings
    taken meanwhile are folded into the wait (the pass after it covers them)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) >= SHORTEST_WAIT_SECONDS:
        if wait(client, left) == CAPACITY:
            return True
    return False
