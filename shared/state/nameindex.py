"""Every job's name in this process's memory, for keyword search.

A keyword (a part of the job name, any case) cannot be answered by a sorted
set: without an index, a rare keyword meant reading all 100,000 job ids out of
Redis to look at each (about 140 ms). An index in Redis (n-grams) would cost
more memory per job than the job itself. Here each process keeps the ids it
has seen, in the order of the all-jobs index (`keys.JOBS`, scored by creation
time), with their lowercased names joined in chunks, and searches them with
`str.find` at C speed.

Redis stays the one source of truth: every search first brings the copy up to
date in one round trip (the ids scored at or after the newest seen, and the
index's size). Ids only ever arrive at the end, except when retention removes
old jobs; a size that does not add up then means a full reload. A job deleted
between the refresh and the caller's read of its record is dropped by the
caller, as with any index entry.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

from shared.state import keys

CHUNK_NAMES = 4096  # names per searched string: appending rebuilds only the last one
_SEPARATOR = "\n"  # never in a job name (shared/domain/names.py)


def job_name(job_id: str) -> str:
    """The name part of a job id (`user~name`), lowercased, as keywords match it."""
    return job_id.partition("~")[2].lower()


@dataclass
class _Chunk:
    ids: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    _text: str | None = None
    _starts: list[int] = field(default_factory=list)

    def extend(self, job_ids: list[str]) -> None:
        self.ids.extend(job_ids)
        self.names.extend([job_id.partition("~")[2].lower() for job_id in job_ids])
        self._text = None

    def matches(self, needle: str) -> list[int]:
        """Positions (oldest first) of the names that contain `needle`."""
        if _SEPARATOR in needle:
            return []
        if self._text is None:
            self._text = _SEPARATOR.join(self.names)
            self._starts, position = [], 0
            for name in self.names:
                self._starts.append(position)
                position += len(name) + 1
        text, starts, found = self._text, self._starts, []
        at = text.find(needle)
        while at >= 0:
            index = bisect.bisect_right(starts, at) - 1
            found.append(index)
            at = text.find(needle, starts[index] + len(self.names[index]) + 1)
        return found


class NameIndex:
    """This process's copy of the all-jobs index, searched by keyword."""

    def __init__(self, client: Any) -> None:
        self.r = client
        self._lock = threading.Lock()
        self._chunks: list[_Chunk] = []
        self._count = 0
        self._members: set[str] = set()
        self._newest = float("-inf")  # the highest score seen
        self.reloads = 0  # full reloads done (tests and the benchmark read it)

    def search(self, keyword: str, limit: int | None = None) -> list[str]:
        """Ids of the jobs whose name contains `keyword` (any case), newest first;
        the first `limit` of them when given."""
        needle = keyword.lower()
        with self._lock:
            self._refresh()
            found: list[str] = []
            for chunk in reversed(self._chunks):
                positions = chunk.matches(needle)
                found.extend(chunk.ids[i] for i in reversed(positions))
                if limit is not None and len(found) >= limit:
                    return found[:limit]
            return found

    def _refresh(self) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.zcard(keys.JOBS)
        pipe.zrangebyscore(keys.JOBS, self._newest, "+inf", withscores=True)
        size, tail = pipe.execute()
        new = [job_id for job_id, _score in tail if job_id not in self._members]
        # An id held already and now scored after the newest seen was removed
        # and added again (a name used anew after its job expired).
        moved = any(s > self._newest and i in self._members for i, s in tail)
        if moved or self._count + len(new) != int(size):
            self._reload()
            return
        if tail:
            self._append(new, tail[-1][1])

    def _reload(self) -> None:
        self.reloads += 1
        self._chunks, self._count, self._members = [], 0, set()
        self._newest = float("-inf")
        pipe = self.r.pipeline(transaction=True)  # the ids and the newest score, at one instant
        pipe.zrange(keys.JOBS, 0, -1)
        pipe.zrange(keys.JOBS, -1, -1, withscores=True)
        ids, last = pipe.execute()
        if last:
            self._append(ids, last[0][1])

    def _append(self, job_ids: list[str], newest: float) -> None:
        """Add ids that come after every id held; `newest` is the highest score among them."""
        start = 0
        while start < len(job_ids):
            if not self._chunks or len(self._chunks[-1].ids) >= CHUNK_NAMES:
                self._chunks.append(_Chunk())
            chunk = self._chunks[-1]
            part = job_ids[start:start + CHUNK_NAMES - len(chunk.ids)]
            chunk.extend(part)
            start += len(part)
        self._members.update(job_ids)
        self._count += len(job_ids)
        self._newest = max(self._newest, newest)
