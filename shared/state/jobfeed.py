"""The feed of job changes: what an API process needs to keep its job table
(shared/state/jobtable.py) current in one round trip, and what tells a
scheduler's pass which queued records moved since the last
(`Store.snapshot`'s `feed`).

Every write of a job record (`Store.write_job`), every new job (`Store.
insert_job`'s script) and every job removed (`retention.forget_job`) appends
one entry to a capped Redis stream, in the same atomic step as the write
itself: the job's id and its sort fields (`SortRow`), or an empty row for a
job gone. So the stream's order is the writes' commit order, and a reader
that applies the entries in order holds what the records hold.

A reader keeps the id of the last entry it applied and the stream's
`entries-added` count at that entry. When the count has grown by more than
the entries still after its id, the stream was trimmed past it (a reader
idle through more than `MAX_LEN` changes): it loads the table again.

The cost is bounded whatever the number of jobs: about `MAX_LEN` entries of
about 80 bytes (4.2 MB measured by `bench list_jobs`: 42 bytes a job at
100,000 jobs, 4 at 1,000,000), and one `XADD` inside writes that already
take their round trip.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shared.domain.models import Job
from shared.state import keys

MAX_LEN = 50_000  # entries kept (approximately: Redis trims whole nodes)
_SEPARATOR = "\t"  # never in a state, a VC name or a number
GONE = ""  # the row of a job removed


@dataclass(frozen=True)
class SortRow:
    """A job's fields the list can sort or filter by, beside those its id holds."""

    created_ms: int
    state: str
    virtual_cluster: str
    gpus: int
    retries: int
    started_ms: int | None
    completed_ms: int | None

    @classmethod
    def of(cls, job: Job) -> SortRow:
        return cls(job.created_ms, job.state.value, job.virtual_cluster, job.gpus,
                   job.retries, job.started_ms, job.completed_ms)

    @classmethod
    def from_fields(cls, created_ms: int, fields: dict[str, str | None]) -> SortRow:
        """From a record's fields (an archived record's: a compacted job)."""
        return cls(created_ms, fields.get("state") or "",
                   fields.get("virtual_cluster") or "default", _number(fields.get("gpus")),
                   _number(fields.get("retries")), _optional(fields.get("started_ms")),
                   _optional(fields.get("completed_ms")))

    def encode(self) -> str:
        return _SEPARATOR.join((
            str(self.created_ms), self.state, self.virtual_cluster, str(self.gpus),
            str(self.retries), _text(self.started_ms), _text(self.completed_ms)))

    @classmethod
    def decode(cls, raw: str) -> SortRow:
        created, state, vc, gpus, retries, started, completed = raw.split(_SEPARATOR)
        return cls(int(created), state, vc, int(gpus), int(retries), _optional(started),
                   _optional(completed))


def _number(raw: str | None) -> int:
    return int(raw) if raw not in (None, "", "None") else 0


def _optional(raw: str | None) -> int | None:
    return int(raw) if raw not in (None, "", "None") else None


def _text(value: int | None) -> str:
    return "" if value is None else str(value)


def add_change(pipe: Any, job: Job) -> None:
    """Queue the entry for a job record written in the same transaction."""
    pipe.xadd(keys.JOB_CHANGES, {"j": job.id, "d": SortRow.of(job).encode()},
              maxlen=MAX_LEN, approximate=True)


def add_removal(pipe: Any, job_id: str) -> None:
    """Queue the entry for a job removed in the same transaction."""
    pipe.xadd(keys.JOB_CHANGES, {"j": job_id, "d": GONE}, maxlen=MAX_LEN, approximate=True)


@dataclass(frozen=True)
class Changes:
    """What one read of the feed answered, at one instant."""

    jobs: int  # the all-jobs index's size
    added: int  # entries ever added to the feed
    last_id: str  # the newest entry's id ("0-0": none yet)
    entries: list[tuple[str, str, str]]  # (entry id, job id, encoded row or GONE)

    def missed(self, added: int) -> int:
        """How many entries after the reader's position this read left out,
        `added` being the feed's count at that position: more than none when
        the feed was trimmed past it or the read stopped at its page; less
        than none when the feed is a new one (deleted and written again)."""
        return self.added - added - len(self.entries)

    def position(self) -> FeedPosition:
        """Where a reader stands once it has applied every entry of this read."""
        return FeedPosition(self.last_id, self.added)


@dataclass(frozen=True)
class FeedPosition:
    """A reader's place in the feed: the last entry it applied and the feed's
    entries-added count there (what tells it the feed was trimmed past it)."""

    after: str
    added: int
