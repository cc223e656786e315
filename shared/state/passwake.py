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
"""

from __future__ import annotations

from typing import Any

from shared.state import keys

KEY = keys.SCHEDULER_WAKE


def ring(pipe: Any) -> None:
    """Queue on `pipe` a request for a pass."""
    pipe.lpush(KEY, "1")
    pipe.ltrim(KEY, 0, 0)


def ring_now(client: Any) -> None:
    """Ask for a pass now: one round trip."""
    pipe = client.pipeline(transaction=False)
    ring(pipe)
    pipe.execute()


def wait(client: Any, seconds: float) -> bool:
    """Whether a pass was asked for, waiting up to `seconds` for a ring;
    the ring is taken."""
    return client.blpop([KEY], timeout=seconds) is not None
