"""Reading many jobs at once: the job list (an index's range, or this
process's table of sort fields), many records, fields or hashes in one
script call a chunk, and the feed of job changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.client import NEVER_DECODE

from shared.domain import jobsort
from shared.domain.archive import Archive
from shared.domain.models import Job
from shared.domain.states import JobState
from shared.infra.clock import now_ms
from shared.state import jobfeed, keys, scripts
from shared.state.jobfeed import Changes
from shared.state.jobtable import JobTable
from shared.state.store import StoreCore

SORT_READ_CHUNK = 2000  # hashes `read_fields` reads per script call: about 1 ms of Redis
_MISSING = "\x01"  # what scripts.HMGET_JOINED answers for a field that is not there
_UNCHANGED = "\x02"  # what scripts.HMGET_STAMPED answers for a record held already
# keys per HGETALL_MANY or QUEUED_RECORDS call (each call holds Redis for its length)
READ_MANY = 10_000


class ListingMixin(StoreCore):
    @property
    def table(self) -> JobTable:
        """This process's table of every job's sort fields (made on first use)."""
        if self._table is None:
            self._table = JobTable(self)
        return self._table

    def list_jobs(
        self, *, username: str | None = None, vc: str | None = None,
        state: str | None = None, keyword: str | None = None, offset: int = 0,
        limit: int = 50, oldest_first: bool = False, sort: str = jobsort.SUBMIT_TIME,
    ) -> tuple[list[Job], int]:
        """A page of the jobs that pass the filters (`keyword`: a part of the
        name, any case), newest first (`oldest_first`: the other way), or by
        another field (`sort`, shared/domain/jobsort.py); and how many pass.

        The list as it opens, everyone's or one user's, VC's or state's jobs
        by submit time, is a range of that index: no more than the page is
        read. Any other list (two filters, a keyword, another field) is
        answered by this process's table of every job's sort fields and
        names (shared/state/jobtable.py), brought up to date first.
        """
        filters = [(keys.user_jobs, username), (keys.vc_jobs, vc), (keys.state_jobs, state)]
        given = [index(value) for index, value in filters if value]
        if sort == jobsort.SUBMIT_TIME and not keyword and len(given) <= 1:
            index_key = given[0] if given else keys.JOBS
            pipe = self.r.pipeline(transaction=False)
            pipe.zcard(index_key)
            (pipe.zrange if oldest_first else pipe.zrevrange)(
                index_key, offset, offset + limit - 1)
            total, ids = pipe.execute()
            return self._jobs(ids), int(total)
        ids, matched = self.table.page(
            sort=sort, descending=not oldest_first, offset=offset, limit=limit,
            now=now_ms(), username=username, vc=vc, state=state, keyword=keyword)
        return self._jobs(ids), matched

    def _jobs(self, ids: Sequence[str]) -> list[Job]:
        found = self.read_jobs(ids)
        return [found[i] for i in ids if i in found]

    def read_jobs(self, ids: Sequence[str]) -> dict[str, Job]:
        """The records of the jobs that exist among `ids`, in two round trips
        at most: the hashes, then the archives of the compacted ones."""
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(keys.job(job_id))
        found = {i: Job.from_fields({"id": i, **f})
                 for i, f in zip(ids, pipe.execute(), strict=True) if f}
        compacted = [i for i in ids if i not in found]
        for job_id, record in self.archived_records(compacted).items():
            found[job_id] = Job.from_fields({"id": job_id, **record})
        return found

    def archived_records(self, ids: Sequence[str]) -> dict[str, dict[str, str]]:
        """The records of compacted jobs, from their archives, one round trip
        (a job with no archive either is gone, and left out)."""
        if not ids:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.execute_command("GET", keys.job_archive(job_id), **{NEVER_DECODE: True})
        records = {}
        for job_id, blob in zip(ids, pipe.execute(), strict=True):
            record = Archive.record_of(blob) if blob else None
            if record is not None:
                records[job_id] = record
        return records

    def read_fields(self, hashes: Sequence[str], fields: Sequence[str],
                    chunk: int = SORT_READ_CHUNK) -> list[list[str | None]]:
        """HMGET of the same `fields` (at least one) from each of many hashes
        (None for a field or hash that is not there), in one script call per
        `chunk` hashes, each answering one joined string: one command instead
        of one each, and one reply to parse a call, which is most of the
        client's cost of reading thousands of small hashes. The values must
        hold no NUL (job records: numbers, states, names, JSON)."""
        width = len(fields)
        values: list[list[str | None]] = []
        for start in range(0, len(hashes), chunk):
            flat = self.run_script(scripts.HMGET_JOINED, hashes[start:start + chunk],
                                   fields).split("\0")
            rows: list[list[str | None]] = [flat[n:n + width]
                                            for n in range(0, len(flat), width)]
            if _MISSING in flat:  # rare: a field never written, or a hash gone
                rows = [[None if v == _MISSING else v for v in row] for row in rows]
            values += rows
        return values

    def read_stamped_fields(self, hashes: Sequence[str], stamps: Sequence[str],
                            fields: Sequence[str], chunk: int = SORT_READ_CHUNK,
                            ) -> list[tuple[str, list[str | None]] | None]:
        """`read_fields` of job records the caller may hold already: for
        each hash, None where its stamp (`version:queue_seq:mode`: every
        write of a record but its waiting reason and its mode moves the
        version, and a name submitted again has a new queue_seq) is the one
        in `stamps` ('': none held), else the stamp now and the fields. The
        stamp is '' for a record that cannot be matched (gone, or without a
        version or queue_seq): not worth holding."""
        width = len(fields)
        values: list[tuple[str, list[str | None]] | None] = []
        for start in range(0, len(hashes), chunk):
            part = hashes[start:start + chunk]
            flat = self.run_script(scripts.HMGET_STAMPED, part,
                                   [*stamps[start:start + chunk], *fields]).split("\0")
            at = 0
            for _ in part:
                if flat[at] == _UNCHANGED:
                    values.append(None)
                    at += 1
                    continue
                row: list[str | None] = flat[at + 1:at + 1 + width]
                values.append((flat[at], [None if v == _MISSING else v for v in row]))
                at += 1 + width
        return values

    def read_columns(self, hashes: Sequence[str], fields: Sequence[tuple[str, str]],
                     chunk: int = SORT_READ_CHUNK) -> list[str]:
        """The same fields of many hashes a column at a time: for each (field,
        default) one string, each hash's value (the default where it has
        none) joined by spaces, read `chunk` hashes a script call. A column
        of numbers is then parsed in C (numpy.fromstring) instead of a value
        at a time. The values must hold no space (job records' numbers,
        states, VC names)."""
        args = [item for pair in fields for item in pair]
        parts: list[list[str]] = [[] for _ in fields]
        for start in range(0, len(hashes), chunk):
            reply = self.run_script(scripts.HMGET_COLUMNS, hashes[start:start + chunk], args)
            for column, text in zip(parts, reply, strict=True):
                column.append(text)
        return [" ".join(column) for column in parts]

    def read_hashes(self, hashes: Sequence[str]) -> list[dict[str, str]]:
        """HGETALL of many hashes ({} for one that is missing), in one script
        call per READ_MANY keys."""
        found: list[dict[str, str]] = []
        for start in range(0, len(hashes), READ_MANY):
            found += [_pairs(flat) for flat in
                      self.run_script(scripts.HGETALL_MANY, hashes[start:start + READ_MANY], [])]
        return found

    def existing(self, names: Sequence[str]) -> list[bool]:
        """Whether each key exists, in one round trip (a script call per
        READ_MANY keys, pipelined)."""
        pipe = self.r.pipeline(transaction=False)
        for start in range(0, len(names), READ_MANY):
            scripts.run(pipe, scripts.EXISTING, names[start:start + READ_MANY], [])
        return [bool(flag) for chunk in (pipe.execute() if names else []) for flag in chunk]

    def read_changes(self, after: str, count: int) -> Changes:
        """The feed of job changes after entry `after` (at most `count`; "":
        none, only where the feed stands), with the feed's position and the
        number of jobs, in one atomic read (shared/state/jobfeed.py)."""
        return changes_of(self.run_script(
            scripts.READ_JOB_CHANGES, [keys.JOB_CHANGES, keys.JOBS], [after, str(count)]))

    def job_fields(self, job_ids: Sequence[str], fields: Sequence[str]
                   ) -> list[list[str | None]]:
        """The same `fields` of each job's record (None: not there; a
        compacted job's record is not read), in one round trip."""
        pipe = self.r.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(keys.job(job_id), list(fields))
        return pipe.execute() if job_ids else []

    def count_vc_jobs(self, vcs: Sequence[str], states: Sequence[JobState]
                      ) -> dict[tuple[str, JobState], int]:
        """How many jobs of each VC are in each state, in one round trip."""
        wanted = [(vc, state) for vc in vcs for state in states]
        pipe = self.r.pipeline(transaction=False)
        for vc, state in wanted:
            pipe.zintercard(2, [keys.vc_jobs(vc), keys.state_jobs(state)])
        return dict(zip(wanted, pipe.execute() if wanted else [], strict=True))

    def vc_queue_ids(self, vc: str, limit: int) -> list[str]:
        """The first `limit` jobs of the VC's queue, in the order they go."""
        return self.r.zrange(keys.vc_queue(vc), 0, limit - 1)

    def job_ids_in_state(self, state: JobState) -> list[str]:
        """Every job in `state`, oldest first."""
        return self.r.zrange(keys.state_jobs(state), 0, -1)

    def queued_job_ids(self, limit: int = 100_000) -> list[str]:
        return self.r.zrange(keys.QUEUE, 0, limit - 1)


def _pairs(flat: Sequence[str]) -> dict[str, str]:
    """A hash from HGETALL's flat field/value list, as a script returns it."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def changes_of(reply: Sequence[Any]) -> Changes:
    """READ_JOB_CHANGES's reply, parsed."""
    jobs, added, last_id, raw = reply
    entries = []
    for entry_id, fields in raw:
        values = dict(zip(fields[::2], fields[1::2], strict=True))
        entries.append((entry_id, values.get("j", ""), values.get("d", jobfeed.GONE)))
    return Changes(int(jobs), int(added), last_id, entries)
