"""Each attempt's last reported checkpoint step (shared/domain/checkpoints.py).

One hash per job (keys.job_checkpoints: attempt -> step), written by the
monitor in the same pipeline as the log lines that reported it, read by the
API's job detail. It lives as long as the job: compaction keeps it, expiry
and deletion remove it with the job's other keys (retention.job_keys).
"""

from __future__ import annotations

from typing import Any

from shared.state import keys


def record_step(pipe: Any, job_id: str, attempt: int, step: int) -> None:
    """Queue the attempt's newest step on `pipe` (idempotent: a line shipped
    twice writes the same value)."""
    pipe.hset(keys.job_checkpoints(job_id), str(attempt), str(step))


def read_steps(reader: Any, job_id: str) -> dict[int, int]:
    """attempt -> last checkpoint step, for the attempts that reported one."""
    raw: dict[str, str] = reader.hgetall(keys.job_checkpoints(job_id))
    steps: dict[int, int] = {}
    for attempt, step in raw.items():
        if attempt.isdigit() and step.isdigit():
            steps[int(attempt)] = int(step)
    return steps
