"""Task logs: one bounded stream per task of an attempt, appended by the
monitor, read, tailed and followed by the API.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from shared.state import keys
from shared.state.store import StoreCore


class LogsMixin(StoreCore):
    """Each task's log stream."""

    def append_log(self, job_id: str, attempt: int, role: str, index: int,
                   lines: Sequence[str], max_lines: int) -> None:
        if not lines:
            return
        key = keys.task_log(job_id, attempt, role, index)
        pipe = self.r.pipeline(transaction=False)
        for line in lines:
            pipe.xadd(key, {"l": line}, maxlen=max_lines, approximate=True)
        pipe.execute()

    def read_log(self, job_id: str, attempt: int, role: str, index: int,
                 tail: int | None = None, after: str = "-") -> list[tuple[str, str]]:
        """(entry id, line) pairs: the last `tail` lines, or those after an id."""
        key = keys.task_log(job_id, attempt, role, index)
        if tail is not None:
            if tail <= 0:  # Redis refuses COUNT 0: nothing is asked for
                return []
            entries = list(reversed(self.r.xrevrange(key, count=tail)))
        else:
            start = "-" if after == "-" else f"({after}"
            entries = self.r.xrange(key, min=start)
        return [(entry_id, fields.get("l", "")) for entry_id, fields in entries]

    def follow_log(self, job_id: str, attempt: int, role: str, index: int, *, after: str,
                   block_ms: int) -> list[tuple[str, str]]:
        """Lines after entry `after`, waiting up to `block_ms` for the first one."""
        key = keys.task_log(job_id, attempt, role, index)
        reply = self.r.xread({key: after}, count=1000, block=block_ms or None)
        if not reply:
            return []
        return [(entry_id, fields.get("l", "")) for entry_id, fields in reply[0][1]]

    def log_extent(self, job_id: str, attempt: int, role: str, index: int) -> tuple[int, int]:
        """(lines the stream keeps, lines ever appended to it): their difference is
        what the bound dropped, oldest first."""
        try:
            info = self.r.xinfo_stream(keys.task_log(job_id, attempt, role, index))
        except redis.ResponseError:  # no such key: nothing shipped yet
            return 0, 0
        kept = int(info["length"])
        return kept, max(kept, int(info.get("entries-added") or kept))

    def last_log_id(self, job_id: str, attempt: int, role: str, index: int) -> str:
        """The id of the newest line (or "0-0"): following starts after it."""
        entries = self.r.xrevrange(keys.task_log(job_id, attempt, role, index), count=1)
        return str(entries[0][0]) if entries else "0-0"
