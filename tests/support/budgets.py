"""A running task's span that stays inside today, for the budget tests."""

from __future__ import annotations

import json

from shared.domain.models import task_key
from shared.infra.clock import now_ms
from shared.state import keys, usage
from shared.state.store import Store

MINUTE = 60_000


def launched_early_today(store: Store, job_id: str, attempt: int = 0, role: str = "main",
                         index: int = 0) -> int:
    """Move the running task's placement and launch to a minute past the
    start of today (UTC) and return it. A span of up to a day less two minutes from there
    stays inside today, and so inside every budget period today is in,
    whenever the test runs: a span from the clock's now crossed midnight (a
    week's end, on a Sunday) in the last minutes of a day."""
    task = store.get_task(job_id, attempt, role, index)
    assert task is not None and task.launched_ms is not None
    task.placed_ms = task.launched_ms = usage.day_start_ms(usage.day_of(now_ms())) + MINUTE
    store.r.hset(keys.job_tasks(job_id, attempt), task_key(role, index),
                 json.dumps(task.to_dict()))
    return task.launched_ms
