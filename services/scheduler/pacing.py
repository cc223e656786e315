"""When the wake thread answers a ring for new work: the pacing of passes
asked for only because jobs were queued.

The rules:

1. A ring for freed capacity (an exit, a GPU fault cleared; the doorbell's
   CAPACITY) is answered at once: a GPU must not idle behind it.
2. A ring for new work (a submit; NEW_WORK) is answered at once unless this
   scheduler's last pass left jobs waiting: on an idle or unsaturated
   cluster a lone submit is placed as soon as it is stored.
3. Otherwise, at `interval` seconds after that last pass began. The jobs
   ahead of the new one already wait for capacity, so a pass for each
   submit of a burst would mostly find nothing to place; a pass reads the
   whole queue, so a sweep of N submits into a full cluster cost N passes
   over a growing queue. One pass then takes every job queued meanwhile.
   A ring for freed capacity during the wait ends it (rule 1).

Slurm's `sched_min_interval` and `defer` answer the same burst the same
way. The cost is bounded: a new job that would fit beside the waiting ones
(smaller, another VC) or preempt them is placed up to `interval` later.
Pure: the wake thread (services/scheduler/run.py) applies it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LastPass:
    """What the wake thread needs of this scheduler's last pass."""

    began: float  # time.monotonic() when it began
    left_waiting: bool  # it left jobs waiting


def new_work_delay(last: LastPass | None, now: float, interval: float) -> float:
    """Seconds to wait before the pass a ring for new work asks for (0: now)."""
    if last is None or not last.left_waiting or interval <= 0:
        return 0.0
    return max(0.0, last.began + interval - now)
