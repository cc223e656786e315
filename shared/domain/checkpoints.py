"""The line a job prints to report a checkpoint: `PAI_CHECKPOINT_STEP=<step>`.

A job that saved a checkpoint says so on a line of its own in its output
(stdout or stderr); the platform keeps, per attempt, the highest step such
lines named (steps grow as training goes; the highest is also what survives
log lines delivered twice or late), and the job detail shows it
(`attempts[].checkpointStep`), so a
user sees how far a preempted or failed attempt had got and where its retry
resumes. The platform acts on nothing else in the line: the job's output is
untrusted, so the match is exact (the whole line, a decimal of at most 15
digits, optional trailing spaces), anything else is an ordinary log line,
and a batch of lines yields at most one step (its last), whatever it holds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PREFIX = "PAI_CHECKPOINT_STEP="
MAX_DIGITS = 15
_LINE = re.compile(rf"{PREFIX}([0-9]{{1,{MAX_DIGITS}}}) *")


def checkpoint_step(line: str) -> int | None:
    """The step a report line names, or None for any other line."""
    if not line.startswith(PREFIX):  # the common case, without the regex
        return None
    found = _LINE.fullmatch(line)
    return int(found.group(1)) if found else None


def last_checkpoint_step(lines: Iterable[str]) -> int | None:
    """The step of the last report line among `lines`, if any."""
    last = None
    for line in lines:
        step = checkpoint_step(line)
        if step is not None:
            last = step
    return last
