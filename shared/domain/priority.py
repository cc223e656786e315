"""Job priority classes and the order a virtual cluster's queue keeps.

OpenPAI HiveD's names: `prod` > `test` (the default) > `oppo`. An `oppo`
job is opportunistic: it never counts against a guarantee, so it runs only
on capacity no guaranteed work wants and is the first to be preempted.

One place decides the within-VC order (class first, then submit order), so
the scheduler's pass, the queue index the API reads positions from, and the
trace simulator agree on who is next.
"""

from __future__ import annotations

from enum import IntEnum

DEFAULT_CLASS = "test"


class PriorityClass(IntEnum):
    OPPO = 0
    TEST = 1
    PROD = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, name: str | None) -> PriorityClass:
        """The class a job asked for by name (None or "": the default)."""
        return cls[(name or DEFAULT_CLASS).upper()]


CLASS_NAMES = tuple(c.label for c in sorted(PriorityClass, reverse=True))

# Queue sequences are counters far below this; a class step is worth more
# than any of them, and the sum stays an exact float (Redis scores).
_CLASS_STEP = float(2 ** 44)
# Least-attained-service queues within a class (services/scheduler/policy.py
# `Las`): a queue step is worth more than any sequence, 16 of them less than
# a class step.
_LAS_STEP = float(2 ** 40)
MAX_LAS_QUEUE = 15


def queue_order(priority: PriorityClass, queue_seq: int, las_queue: int = 0) -> float:
    """A job's place in its VC's queue, lower first: higher classes first,
    then lower least-attained-service queues, then submit order (a preempted
    or retried job keeps its `queue_seq`, so it goes back to its old position
    among the jobs of its queue)."""
    return (PriorityClass.PROD - priority) * _CLASS_STEP \
        + min(max(las_queue, 0), MAX_LAS_QUEUE) * _LAS_STEP + queue_seq
