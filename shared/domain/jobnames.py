"""The job table's two views of its jobs' names: their order (`sort=name`)
and their text (`keyword=`), kept as jobs arrive.

The API's job table (shared/state/jobtable.py) holds a row per job in
submit-time order, its fields as columns of numbers. A name is text, so:

- `NameOrder` keeps the rows sorted by (name, row), and each row's rank in
  that order: a column of numbers the sort compares like any other. Names
  never change, so only new rows move it: a few are placed by binary search
  and inserted in one pass; many (a load) are sorted all at once.
- `NameText` keeps every row's lowercased name in one byte array, and finds
  the rows whose name holds a keyword with a few vectorized passes over it
  (where the keyword's rarest byte is, then each other byte among the
  candidates left), not a step of Python per match.

Rows the table renumbers (a submit merged in behind newer ones, dead rows
dropped) are taken in again. Pure: no IO, tested in tests/unit/test_jobnames.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from shared.domain.jobsort import Ints, name_key

Rows = npt.NDArray[np.intp]
PLACE_AT_MOST = 256  # more new rows than this (or an eighth of the rows): sort all


class NameOrder:
    """Rows 0 .. covered-1 in the order of their job's name, then by row."""

    def __init__(self) -> None:
        self.order: Rows = np.empty(0, dtype=np.intp)
        self.covered = 0
        self._ranks: Ints | None = None

    def ranks(self, ids: Sequence[str], rows: int) -> Ints:
        """Each of the first `rows` rows' place in the name order, where
        `ids[row]` is the row's job id."""
        if self.covered < rows:
            self._extend(ids, rows)
        if self._ranks is None or len(self._ranks) != rows:
            self._ranks = np.empty(rows, dtype=np.int64)
            self._ranks[self.order] = np.arange(rows, dtype=np.int64)
        return self._ranks

    def _extend(self, ids: Sequence[str], rows: int) -> None:
        def key(row: int) -> tuple[str, str]:
            return name_key(ids[row])

        new = range(self.covered, rows)
        if len(new) > max(PLACE_AT_MOST, self.covered // 8):
            self.order = np.asarray(sorted(range(rows), key=key), dtype=np.intp)
        else:
            placed = sorted(new, key=key)  # stable: equal names by row
            at = [bisect.bisect_right(self.order, key(row), key=key) for row in placed]
            self.order = np.insert(self.order, at, placed)
        self.covered, self._ranks = rows, None

    def forget_from(self, row: int) -> None:
        """Rows from `row` on are renumbered: they will be placed again."""
        if self.covered > row:
            self.order = self.order[self.order < row]
            self.covered, self._ranks = row, None

    def renumber(self, new_rows: Rows, kept: npt.NDArray[np.bool_]) -> None:
        """The table dropped the rows not `kept`; `new_rows[old]` is where a
        kept row is now (the kept rows' order does not change)."""
        self.order = new_rows[self.order[kept[self.order]]]
        self.covered, self._ranks = int(np.count_nonzero(kept[:self.covered])), None


_SEPARATOR = b"\n"  # never in a job name (shared/domain/names.py)


class NameText:
    """Rows 0 .. covered-1's lowercased names, one byte array, for keywords."""

    def __init__(self) -> None:
        self.covered = 0
        self._text: npt.NDArray[np.uint8] = np.empty(0, dtype=np.uint8)
        self._starts: Ints = np.empty(0, dtype=np.int64)  # each row's first byte
        self._counts: Ints = np.zeros(256, dtype=np.int64)  # how often each byte occurs

    def rows_with(self, needle: str, ids: Sequence[str], rows: int) -> Rows:
        """The rows (of the first `rows`) whose job name holds `needle`, any
        case, in order; a row twice when its name holds it twice."""
        if self.covered < rows:
            self._extend(ids, rows)
        pattern = needle.lower().encode("utf-8", "replace")
        if not pattern:
            return np.arange(rows, dtype=np.intp)
        if _SEPARATOR in pattern or len(pattern) > len(self._text):
            return np.empty(0, dtype=np.intp)
        wanted = np.frombuffer(pattern, dtype=np.uint8)
        # Start from the needle's rarest byte: the fewest candidates to check.
        anchor = int(np.argmin(self._counts[wanted]))
        text = self._text
        found = np.flatnonzero(text[anchor:len(text) - len(wanted) + 1 + anchor]
                               == wanted[anchor])
        for offset in range(len(wanted)):
            if offset != anchor:
                found = found[text[found + offset] == wanted[offset]]
        return np.searchsorted(self._starts, found, side="right") - 1

    def _extend(self, ids: Sequence[str], rows: int) -> None:
        names = [job_id.partition("~")[2].lower().encode() for job_id in ids[self.covered:rows]]
        lengths = np.fromiter((len(name) + 1 for name in names), dtype=np.int64,
                              count=len(names))
        starts = len(self._text) + np.concatenate(([0], np.cumsum(lengths)[:-1]))
        added = np.frombuffer(_SEPARATOR.join(names) + _SEPARATOR, dtype=np.uint8)
        self._text = np.concatenate((self._text, added))
        self._counts += np.bincount(added, minlength=256)
        self._starts = np.concatenate((self._starts, starts.astype(np.int64)))
        self.covered = rows

    def forget_from(self, row: int) -> None:
        """Rows from `row` on are renumbered: they will be taken in again."""
        if self.covered > row:
            cut = int(self._starts[row])
            self._counts -= np.bincount(self._text[cut:], minlength=256)
            self._text, self._starts, self.covered = self._text[:cut], self._starts[:row], row
