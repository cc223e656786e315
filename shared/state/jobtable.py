"""Every job's sort fields in this process's memory, as columns: the job list
sorted by any field and filtered by user, VC and state, at any size.

Sorting the whole store by a field used to read that field of every job out
of Redis on each request (a quarter to half a second at 100,000 jobs); a
sorted set per field would cost Redis more than 100 bytes a job for each of
eight fields and a write per field on every change. Here each API process
keeps one row per job, in submit-time order (creation time, then id: the
all-jobs index's order), with the fields as numpy columns, and answers a
sorted page with a few passes over them in C (shared/domain/jobsort.py
`page_positions`): a few milliseconds at 100,000 jobs.

Redis stays the one source of truth. The table is loaded once (every id of
the all-jobs index and its record's fields, read a column at a time in
script calls of 2,000 records), then every request first applies the feed of
changes written beside each record (shared/state/jobfeed.py), in one round
trip. A reader left behind by more than the feed keeps, or whose count of
jobs does not add up, loads again.

Rows of removed jobs stay, dead, until a quarter of the table is dead; then
the table is compacted. The name order (the one field not a number) is a
permutation of the rows kept beside the columns (`NameOrder`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from shared.domain import jobsort
from shared.domain.jobnames import NameOrder, NameText, Rows
from shared.domain.jobsort import MISSING, STATE_CODES, Ints
from shared.state import keys
from shared.state.jobfeed import GONE, SortRow

if TYPE_CHECKING:
    from shared.state.store.listing import ListingMixin

Column = npt.NDArray[np.generic]
COLUMNS: dict[str, type[np.generic]] = {
    "created": np.int64, "alive": np.bool_, "state": np.int8, "vc": np.int32,
    "user": np.int32, "gpus": np.int64, "retries": np.int64, "started": np.int64,
    "completed": np.int64,
}
# What a load reads of each record, and what a field it lacks reads as
# ("-" for the state: no record, a compacted job whose archive has it).
LOAD_FIELDS = (("created_ms", "0"), ("state", "-"), ("virtual_cluster", "default"),
               ("gpus", "0"), ("retries", "0"), ("started_ms", "-1"), ("completed_ms", "-1"))
FEED_PAGE = 10_000  # feed entries read per round trip
LOAD_PAGE = 20_000  # job ids read, with their fields, per step of a load
MIN_CAPACITY = 1024


@dataclass
class Batch:
    """Jobs about to become rows: their ids and a value of every column each."""

    ids: list[str]
    columns: dict[str, Column]

    def take(self, order: Sequence[int] | Rows) -> Batch:
        picked = np.asarray(order, dtype=np.intp)
        return Batch([self.ids[n] for n in picked.tolist()],
                     {name: column[picked] for name, column in self.columns.items()})


class JobTable:
    """This process's copy of every job's sort fields (see the module's doc)."""

    def __init__(self, store: ListingMixin) -> None:
        self.store = store
        self._lock = threading.Lock()
        self.loads = 0  # full loads done (tests and the benchmark read it)
        self._reset()

    def _reset(self) -> None:
        self.size = 0  # rows used, dead ones included
        self.dead = 0
        self.ids: list[str] = []
        self.rows: dict[str, int] = {}  # a live job's id -> its row
        self.columns: dict[str, Column] = {
            name: np.zeros(MIN_CAPACITY, dtype=kind) for name, kind in COLUMNS.items()}
        self.texts: dict[str, list[str]] = {"user": [], "vc": []}  # code -> text
        self._codes: dict[str, dict[str, int]] = {"user": {}, "vc": {}}
        self.names = NameOrder()
        self.text = NameText()
        self.after: str | None = None  # the last feed entry applied; None: not loaded
        self.added = 0  # the feed's entries-added count at `after`

    # ------------------------------------------------------------ queries

    def page(self, *, sort: str, descending: bool, offset: int, limit: int, now: int,
             username: str | None = None, vc: str | None = None, state: str | None = None,
             keyword: str | None = None) -> tuple[list[str], int]:
        """The ids of the page `offset`..`offset+limit` of the jobs that pass
        every filter given (`keyword`: a part of the name, any case), sorted
        by `sort`, and how many pass; current as of this call."""
        with self._lock:
            self.refresh()
            selected = self._select(username, vc, state, keyword)
            if sort == jobsort.SUBMIT_TIME:  # the rows' own order
                matched = self.size if selected is None else len(selected)
                positions = jobsort.range_page(matched, offset, limit, descending=descending)
            else:
                values = self._values(sort, selected, now)
                matched = len(values)
                positions = jobsort.page_positions(values, offset, limit,
                                                   descending=descending)
            chosen = positions if selected is None else selected[positions]
            return [self.ids[row] for row in chosen.tolist()], matched

    def _select(self, username: str | None, vc: str | None, state: str | None,
                keyword: str | None) -> Rows | None:
        """The rows that pass the filters (None: every row, none dead)."""
        size, columns = self.size, self.columns
        wanted: list[tuple[str, int]] = []
        for column, value, codes in (("user", username, self._codes["user"]),
                                     ("vc", vc, self._codes["vc"]),
                                     ("state", state, STATE_CODES)):
            if value:
                if value not in codes:
                    return np.empty(0, dtype=np.intp)
                wanted.append((column, codes[value]))
        if not wanted and not keyword and not self.dead:
            return None
        mask = columns["alive"][:size].astype(np.bool_)
        for column, code in wanted:
            mask &= columns[column][:size] == code
        if keyword:
            named = np.zeros(size, dtype=np.bool_)
            named[self.text.rows_with(keyword, self.ids, size)] = True
            mask &= named
        return np.flatnonzero(mask)

    def _values(self, sort: str, selected: Rows | None, now: int) -> Ints:
        """The sort field's value of each selected row, as comparable integers."""
        def column(name: str) -> Ints:
            whole = self.columns[name][:self.size]
            return (whole if selected is None else whole[selected]).astype(np.int64, copy=False)

        if sort == "name":
            ranks = self.names.ranks(self.ids, self.size)
            return ranks if selected is None else ranks[selected]
        if sort == "username":
            return jobsort.text_ranks(self.texts["user"], ignore_case=True)[column("user")]
        if sort == "virtualCluster":
            return jobsort.text_ranks(self.texts["vc"], ignore_case=False)[column("vc")]
        if sort == "duration":
            return jobsort.durations(column("started"), column("completed"), now)
        named = {"state": "state", "gpus": "gpus", "retries": "retries",
                 "completedTime": "completed"}
        return column(named[sort])

    # ------------------------------------------------------------ keeping up

    def refresh(self) -> None:
        """Apply the feed's new entries; load the whole table when it cannot
        be brought up to date that way."""
        if self.after is None:
            self._load()
        while True:
            assert self.after is not None
            changes = self.store.read_changes(self.after, FEED_PAGE)
            missed = changes.missed(self.added)
            if missed < 0 or (missed > 0 and len(changes.entries) < FEED_PAGE):
                self._load()  # trimmed past what this table saw, or a new feed
                continue
            self.apply(changes.entries)
            if len(changes.entries) < FEED_PAGE:
                break
        if self.size - self.dead != changes.jobs:
            self._load()  # something changed the jobs without the feed
        if self.dead > max(MIN_CAPACITY, self.size // 4):
            self._compact()

    def _load(self) -> None:
        """Every job, from the index and the records, as of the feed's
        position read first: changes made while loading come after it."""
        self.loads += 1
        self._reset()
        start = self.store.read_changes("", 0)
        self.after, self.added = start.last_id, start.added
        offset = 0
        while True:
            ids: list[str] = self.store.r.zrange(keys.JOBS, offset, offset + LOAD_PAGE - 1)
            offset += len(ids)
            if ids:
                self._append(self._read(ids))
            if len(ids) < LOAD_PAGE:
                break

    def _read(self, ids: list[str]) -> Batch:
        """The jobs' rows from their records, a column at a time (a compacted
        job's from its archive; a job gone meanwhile is left out)."""
        raw = self.store.read_columns([keys.job(i) for i in ids], LOAD_FIELDS)
        numbers = {name: np.fromstring(raw[n], dtype=np.int64, sep=" ")
                   for n, name in ((0, "created"), (3, "gpus"), (4, "retries"),
                                   (5, "started"), (6, "completed"))}
        for name in ("started", "completed"):
            numbers[name][numbers[name] < 0] = MISSING
        states, vcs = raw[1].split(" "), raw[2].split(" ")
        present = np.ones(len(ids), dtype=np.bool_)
        compacted = [n for n, state in enumerate(states) if state == "-"]
        archived = self.store.archived_records([ids[n] for n in compacted])
        # the index's score: the creation time the rows are ordered by
        scores = self.store.r.zmscore(keys.JOBS, [ids[n] for n in compacted]) if compacted else []
        for n, score in zip(compacted, scores, strict=True):
            record = archived.get(ids[n])
            if record is None or score is None:
                present[n] = False
                continue
            row = SortRow.from_fields(int(score), dict(record))
            states[n], vcs[n] = row.state, row.virtual_cluster
            for name, value in _numbers(row).items():
                numbers[name][n] = value
        batch = Batch(ids, {
            **numbers, "alive": np.ones(len(ids), dtype=np.bool_),
            "state": np.asarray([STATE_CODES.get(s, -1) for s in states], dtype=np.int8),
            "vc": self._codes_of("vc", vcs),
            "user": self._codes_of("user", [i.partition("~")[0] for i in ids])})
        return batch if present.all() else batch.take(np.flatnonzero(present))

    def apply(self, entries: Sequence[tuple[str, str, str]]) -> None:
        """Apply feed entries in their order: a row changed in place, a new
        job added (after every row unless it is older than the newest), a
        job gone marked dead."""
        arriving: dict[str, SortRow] = {}
        for entry_id, job_id, raw in entries:
            self.after = entry_id
            self.added += 1
            if raw == GONE:
                if arriving.pop(job_id, None) is None:
                    self._kill(job_id)
                continue
            row = SortRow.decode(raw)
            held = self.rows.get(job_id)
            if job_id in arriving or held is None:
                arriving[job_id] = row
            elif int(self.columns["created"][held]) != row.created_ms:
                self._kill(job_id)  # the name used again by a new job
                arriving[job_id] = row
            else:
                self._write(held, job_id, row)
        if arriving:
            self._append(self._batch(sorted(arriving.items(),
                                            key=lambda item: (item[1].created_ms, item[0]))))

    def _batch(self, rows: Sequence[tuple[str, SortRow]]) -> Batch:
        ids = [job_id for job_id, _ in rows]
        columns: dict[str, Column] = {
            name: np.asarray([_numbers(row)[name] for _, row in rows], dtype=np.int64)
            for name in ("created", "gpus", "retries", "started", "completed")}
        columns["alive"] = np.ones(len(rows), dtype=np.bool_)
        columns["state"] = np.asarray([STATE_CODES.get(row.state, -1) for _, row in rows],
                                      dtype=np.int8)
        columns["vc"] = self._codes_of("vc", [row.virtual_cluster for _, row in rows])
        columns["user"] = self._codes_of("user", [i.partition("~")[0] for i in ids])
        return Batch(ids, columns)

    def _kill(self, job_id: str) -> None:
        row = self.rows.pop(job_id, None)
        if row is not None:
            self.columns["alive"][row] = False
            self.dead += 1

    def _codes_of(self, kind: str, texts: Sequence[str]) -> npt.NDArray[np.int32]:
        codes, known = self._codes[kind], self.texts[kind]
        for text in set(texts) - codes.keys():
            codes[text] = len(known)
            known.append(text)
        return np.asarray([codes[text] for text in texts], dtype=np.int32)

    def _write(self, at: int, job_id: str, row: SortRow) -> None:
        columns = self.columns
        for name, value in _numbers(row).items():
            columns[name][at] = value
        columns["alive"][at] = True
        columns["state"][at] = STATE_CODES.get(row.state, -1)
        columns["vc"][at] = self._codes_of("vc", [row.virtual_cluster])[0]
        columns["user"][at] = self._codes_of("user", [job_id.partition("~")[0]])[0]

    def _append(self, batch: Batch) -> None:
        """Add jobs (in creation-time, id order) as rows, keeping every row in
        that order: one older than the newest row (another API process's
        submit a millisecond behind) is merged into the rows after it."""
        at = self.size
        first = (int(batch.columns["created"][0]), batch.ids[0])
        if at and first < (int(self.columns["created"][at - 1]), self.ids[at - 1]):
            at = self._first_after(first)
            tail = Batch(self.ids[at:self.size],
                         {name: column[at:self.size].copy()
                          for name, column in self.columns.items()})
            merged = Batch(tail.ids + batch.ids,
                           {name: np.concatenate((tail.columns[name], batch.columns[name]))
                            for name in COLUMNS})
            created = merged.columns["created"].tolist()
            batch = merged.take(sorted(range(len(merged.ids)),
                                       key=lambda n: (created[n], merged.ids[n])))
            self.names.forget_from(at)
            self.text.forget_from(at)
            self.dead -= len(tail.ids) - int(np.count_nonzero(tail.columns["alive"]))
            del self.ids[at:]
        end = at + len(batch.ids)
        self._reserve(end)
        for name, column in batch.columns.items():
            self.columns[name][at:end] = column
        self.ids.extend(batch.ids)
        alive = batch.columns["alive"]
        self.rows.update((job_id, at + n) for n, job_id in enumerate(batch.ids) if alive[n])
        self.dead += len(batch.ids) - int(np.count_nonzero(alive))
        self.size = end

    def _first_after(self, key: tuple[int, str]) -> int:
        created = self.columns["created"][:self.size]
        at = int(np.searchsorted(created, key[0], side="left"))
        while at < self.size and (int(created[at]), self.ids[at]) <= key:
            at += 1
        return at

    def _reserve(self, rows: int) -> None:
        capacity = len(self.columns["alive"])
        if rows <= capacity:
            return
        while capacity < rows:
            capacity *= 2
        for name, column in self.columns.items():
            grown = np.zeros(capacity, dtype=column.dtype)
            grown[:self.size] = column[:self.size]
            self.columns[name] = grown

    def _compact(self) -> None:
        """Drop the dead rows; the live ones keep their order."""
        kept = self.columns["alive"][:self.size].astype(np.bool_)
        new_rows = np.cumsum(kept, dtype=np.intp) - 1
        for column in self.columns.values():
            live = column[:self.size][kept]
            column[:len(live)] = live
            column[len(live):self.size] = 0
        self.names.renumber(new_rows, kept)
        self.text = NameText()  # taken in again on the next keyword
        self.ids = [self.ids[row] for row in np.flatnonzero(kept).tolist()]
        self.rows = {job_id: row for row, job_id in enumerate(self.ids)}
        self.size, self.dead = len(self.ids), 0


def _numbers(row: SortRow) -> dict[str, int]:
    """A row's number columns (MISSING for a time it does not have)."""
    return {"created": row.created_ms, "gpus": row.gpus, "retries": row.retries,
            "started": MISSING if row.started_ms is None else row.started_ms,
            "completed": MISSING if row.completed_ms is None else row.completed_ms}
