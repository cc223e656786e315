"""What the metrics count at scrape time, read from Redis: jobs by state and
virtual cluster, and each VC's queue (its length and how long its oldest job
has waited). Read-only; nothing is cached, so any API worker answers the same.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.domain.states import JobState
from shared.state import keys

# The queue is walked front first until every VC's oldest waiting job is
# known; this bounds one scrape's walk whatever the queue holds.
QUEUE_WALK_LIMIT = 20_000
QUEUE_WALK_CHUNK = 500


@dataclass
class QueueView:
    length: dict[str, int] = field(default_factory=dict)  # vc -> queued jobs
    oldest_ms: dict[str, int] = field(default_factory=dict)  # vc -> when its oldest was queued


def jobs_by_state_and_vc(r: Any, vcs: Sequence[str]) -> dict[tuple[str, str], int]:
    """(state, vc) -> jobs, by intersecting the state and VC index sets."""
    pairs = [(state.value, vc) for state in JobState for vc in vcs]
    pipe = r.pipeline(transaction=False)
    for state, vc in pairs:
        pipe.zintercard(2, [keys.state_jobs(state), keys.vc_jobs(vc)])
    return {pair: int(n) for pair, n in zip(pairs, pipe.execute(), strict=True)}


def queue_view(r: Any, vcs: Sequence[str], limit: int = QUEUE_WALK_LIMIT,
               chunk: int = QUEUE_WALK_CHUNK) -> QueueView:
    """Queued jobs per VC, and when each VC's longest-waiting job was queued.

    The queue is ordered by submit sequence, and a retried job goes back
    with its old sequence, so the first first-attempt job of a VC in queue
    order was submitted before every later job of that VC was submitted or
    re-queued: the walk stops for a VC there. Retried jobs before it are
    timed from their attempt's creation (when they were queued again).
    """
    pipe = r.pipeline(transaction=False)
    for vc in vcs:
        pipe.zintercard(2, [keys.QUEUE, keys.vc_jobs(vc)])
    view = QueueView(length={vc: int(n) for vc, n in zip(vcs, pipe.execute(), strict=True)})
    pending = {vc for vc, n in view.length.items() if n}
    start = 0
    while pending and start < limit:
        ids = r.zrange(keys.QUEUE, start, start + chunk - 1)
        if not ids:
            break
        start += chunk
        pipe = r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hmget(keys.job(job_id), "virtual_cluster", "state", "attempt", "created_ms")
        rows = [_QueuedRow(job_id, vc or "", state, attempt, created)
                for job_id, (vc, state, attempt, created) in zip(ids, pipe.execute(),
                                                                 strict=True)]
        rows = [row for row in rows if row.vc in pending and row.state == JobState.WAITING]
        requeued = _attempt_starts(r, [row for row in rows if row.retried])
        for row in rows:
            queued = requeued.get(row.job_id) if row.retried else int(row.created_ms or 0)
            if queued:
                view.oldest_ms[row.vc] = min(view.oldest_ms.get(row.vc, queued), queued)
            if not row.retried:
                pending.discard(row.vc)
    return view


@dataclass(frozen=True)
class _QueuedRow:
    job_id: str
    vc: str
    state: str | None
    attempt: str | None
    created_ms: str | None

    @property
    def retried(self) -> bool:
        return self.attempt not in (None, "", "0")


def _attempt_starts(r: Any, retried: Sequence[_QueuedRow]) -> dict[str, int]:
    """When each retried job's current attempt was created (queued again)."""
    if not retried:
        return {}
    pipe = r.pipeline(transaction=False)
    for row in retried:
        pipe.hget(keys.job_attempts(row.job_id), row.attempt)
    starts = {}
    for row, raw in zip(retried, pipe.execute(), strict=True):
        created = _json_int(raw, "created_ms")
        if created:
            starts[row.job_id] = created
    return starts


def _json_int(raw: str | None, name: str) -> int | None:
    if not raw:
        return None
    try:
        value = json.loads(raw).get(name)
    except (ValueError, AttributeError):
        return None
    return int(value) if isinstance(value, int | float) else None
