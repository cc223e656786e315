"""Each attempt's newest reported checkpoint step (shared/domain/checkpoints.py):
the highest step the job reported in it.

One hash per job (keys.job_checkpoints: attempt -> step), written by the
monitor in the same pipeline as the log lines that reported it, read by the
API's job detail. It lives as long as the job: compaction keeps it, expiry
and deletion remove it with the job's other keys (retention.job_keys).
"""

from __future__ import annotations

from typing import Any

from shared.state import keys, scripts


def record_step(pipe: Any, job_id: str, attempt: int, step: int) -> None:
    """Queue, on `pipe`, the attempt's step if it is the highest reported
    yet (idempotent and independent of the order reports arrive in)."""
    scripts.run(pipe, scripts.KEEP_HIGHER_STEP, [keys.job_checkpoints(job_id)],
                [str(attempt), str(step)])


def read_steps(reader: Any, job_id: str) -> dict[int, int]:
    """attempt -> newest (highest) checkpoint step, for the attempts that reported one."""
    raw: dict[str, str] = reader.hgetall(keys.job_checkpoints(job_id))
    steps: dict[int, int] = {}
    for attempt, step in raw.items():
        if attempt.isdigit() and step.isdigit():
            steps[int(attempt)] = int(step)
    return steps
