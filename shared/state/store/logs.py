"""Task logs: one bounded stream per task of an attempt, appended by the
monitor, read, tailed and followed by the API. The stream's format, an
entry a batch of lines numbered by its last, is shared/state/logstream.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from shared.state import keys, logstream, scripts
from shared.state.store import StoreCore


def queue_append(pipe: Any, key: str, lines: Sequence[str], max_lines: int,
                 cursor: str = "") -> list[str]:
    """Queue on `pipe` the appending of `lines` to the log stream `key`, as
    entries of at most logstream.ENTRY_LINES lines, the shipping `cursor` on
    the last where one is given; the entries' texts. A line holding newlines
    counts as the lines it holds. Texts are encoded here, so that no line (a
    lone surrogate) can fail redis-py's encoding."""
    step = logstream.ENTRY_LINES
    texts = ["\n".join(lines[at:at + step]) for at in range(0, len(lines), step)]
    for number, text in enumerate(texts, 1):
        scripts.run(pipe, scripts.APPEND_LOG_LINES, [key],
                    [max_lines, logstream.LINES_FIELD, logstream.LEGACY_LINE_FIELD,
                     logstream.CURSOR_FIELD, cursor if number == len(texts) else "",
                     text.encode("utf-8", "replace"), text.count("\n") + 1])
    return texts


# The most lines a follow's read asks for, about: a read's size stays what
# it was when an entry held one line (up to 16 KiB a line).
_FOLLOW_LINES = 1000


def _follow_count(after: str) -> int:
    """Entries a follow's read asks for: a numbered stream's hold up to
    ENTRY_LINES lines; a legacy stream's ids are Redis's times, not 0-<n>."""
    if logstream.position(after)[0]:
        return _FOLLOW_LINES
    return max(1, _FOLLOW_LINES // logstream.ENTRY_LINES)


class LogsMixin(StoreCore):
    """Each task's log stream."""

    def append_log(self, job_id: str, attempt: int, role: str, index: int,
                   lines: Sequence[str], max_lines: int) -> None:
        """Append lines (no shipping cursor): lines written by the platform,
        not shipped from a container."""
        if not lines:
            return
        pipe = self.r.pipeline(transaction=False)
        queue_append(pipe, keys.task_log(job_id, attempt, role, index), lines, max_lines)
        pipe.execute()

    def read_log(self, job_id: str, attempt: int, role: str, index: int,
                 tail: int | None = None, after: str = "-") -> list[tuple[str, str]]:
        """(line id, line) pairs: the last `tail` lines, or those after a line's id."""
        key = keys.task_log(job_id, attempt, role, index)
        if tail is None:
            if after == "-":
                return logstream.lines_after(self.r.xrange(key))
            return logstream.lines_after(self.r.xrange(key, min=f"({after}"), after)
        numbered = self._tail_entries(key, tail)
        if numbered is None:
            return logstream.lines_after(reversed(self.r.xrevrange(key, count=tail)))
        entries, first = numbered
        return logstream.lines_after(entries, logstream.line_id(first - 1))

    def tail_text(self, job_id: str, attempt: int, role: str, index: int, tail: int) -> str:
        """The last `tail` lines as one text, each ending in a newline."""
        key = keys.task_log(job_id, attempt, role, index)
        numbered = self._tail_entries(key, tail)
        if numbered is None:
            return "".join(line + "\n" for _, line in
                           logstream.lines_after(reversed(self.r.xrevrange(key, count=tail))))
        entries, first = numbered
        return logstream.text_from(entries, first)

    def _tail_entries(self, key: str, tail: int) -> tuple[list[logstream.Entry], int] | None:
        """The entries that hold a numbered stream's last `tail` lines, and the
        number of the first of those lines; None for a legacy stream, whose
        last `tail` entries are its last lines."""
        newest = self.r.xrevrange(key, count=1) if tail > 0 else []
        if newest and logstream.is_legacy(newest[0]):
            return None
        if not newest:  # no stream, or a tail of none (Redis refuses COUNT 0)
            return [], 1
        before = logstream.last_number(newest[0]) - tail
        entries = self.r.xrange(key, min=f"({logstream.line_id(before)}" if before > 0 else "-")
        if not entries:  # the stream went meanwhile (its log was filed)
            return [], 1
        # Lines appended since the newest entry was read are read too: the last `tail`.
        return entries, max(1, logstream.last_number(entries[-1]) - tail + 1)

    def follow_log(self, job_id: str, attempt: int, role: str, index: int, *, after: str,
                   block_ms: int) -> list[tuple[str, str]]:
        """Lines after line `after`, waiting up to `block_ms` for the first one."""
        key = keys.task_log(job_id, attempt, role, index)
        reply = self.r.xread({key: after}, count=_follow_count(after), block=block_ms or None)
        if not reply:
            return []
        return logstream.lines_after(reply[0][1], after)

    def log_extent(self, job_id: str, attempt: int, role: str, index: int) -> tuple[int, int]:
        """(lines the stream keeps, lines ever appended to it): their difference is
        what the bound dropped, oldest first."""
        try:
            info = self.r.xinfo_stream(keys.task_log(job_id, attempt, role, index))
        except redis.ResponseError:  # no such key: nothing shipped yet
            return 0, 0
        return logstream.extent(info)

    def last_log_id(self, job_id: str, attempt: int, role: str, index: int) -> str:
        """The id of the newest line (or "0-0"): following starts after it."""
        entries = self.r.xrevrange(keys.task_log(job_id, attempt, role, index), count=1)
        return str(entries[0][0]) if entries else "0-0"
