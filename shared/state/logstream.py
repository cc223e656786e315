"""How a task's log stream (keys.task_log) holds its lines: the format's one
description, and its pure reading. The append script
(shared/state/scripts/logs.py) writes it; shared/state/store/logs.py and
retention read it through these functions.

- An entry holds a batch of lines, as they were shipped, at most
  ENTRY_LINES: its field `t` is the lines joined by newlines (a line holds
  none: lines are cut at them).
- Lines are numbered from 1, every line the stream was ever given counted.
  An entry's id is `0-<n>`, n the number of its last line; a line's id is
  `0-<its number>`, wherever it sits in its entry. So a reader resumes after
  any line it saw, inside an entry or not, and a follow's event ids are
  these ids.
- The field `c`, on the last entry of a shipped batch, is the shipping
  cursor after that batch's last line (services/monitor/logs.py).
- Lines ever given: the last entry's number. Lines kept: from the first
  kept entry's first line. The bound drops whole entries whose lines are
  all older than the newest `max lines`.

After a Redis failover that lost the newest entries, numbering goes on
from the new primary's newest: their numbers are given again, so a follower
that saw the lost lines skips as many new ones (tails and the log file have
them).

One entry a batch, not a line: Redis spent about 1.5 µs a line on an entry
each (the XADD and the script's call of it), more than the rest of
shipping; the append script of an entry a batch costs it about 0.25 µs a
line.

A stream begun before this format holds one line an entry, under the field
`l`, with ids Redis chose (`<ms>-<seq>`). Appends to such a stream go on
that way until its attempt ends, and everything here reads both: a legacy
entry is one line whose id is the entry's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The most lines an entry holds (a bigger batch is written as several): what
# a bound trims in whole entries keeps fewer than this many lines more.
ENTRY_LINES = 500
LINES_FIELD = "t"
CURSOR_FIELD = "c"
LEGACY_LINE_FIELD = "l"

Entry = tuple[str, Mapping[str, str]]  # (entry id, fields), as redis-py decodes them
Line = tuple[str, str]  # (line id, line)


def position(line_id: str) -> tuple[int, int]:
    """A line's (or an entry's) id as a comparable (ms, seq)."""
    ms, _, seq = line_id.partition("-")
    return int(ms), int(seq or 0)


def line_id(number: int) -> str:
    return f"0-{number}"


def is_legacy(entry: Entry) -> bool:
    """An entry of a stream begun before the numbered format: one line."""
    return LINES_FIELD not in entry[1]


def entry_lines(entry: Entry) -> list[Line]:
    """The entry's lines with their ids, oldest first."""
    entry_id, fields = entry
    text = fields.get(LINES_FIELD)
    if text is None:
        return [(entry_id, fields.get(LEGACY_LINE_FIELD, ""))]
    lines = text.split("\n")
    first = position(entry_id)[1] - len(lines) + 1
    return [(f"0-{first + i}", line) for i, line in enumerate(lines)]


def lines_after(entries: Iterable[Entry], after: str | None = None) -> list[Line]:
    """The lines of `entries` (oldest first), those after line `after` only."""
    out: list[Line] = []
    floor = position(after) if after is not None else None
    for entry in entries:
        lines = entry_lines(entry)
        if floor is not None:
            if position(lines[-1][0]) <= floor:
                continue
            if position(lines[0][0]) <= floor:
                lines = [line for line in lines if position(line[0]) > floor]
            else:
                floor = None  # the rest are all later
        out.extend(lines)
    return out


def text_from(entries: Iterable[Entry], first: int) -> str:
    """The lines numbered `first` on, of a numbered stream's entries (oldest
    first), as one text, each line ending in a newline: a tail's answer
    without a line's id or object made."""
    parts = []
    for entry in entries:
        text, last = entry[1][LINES_FIELD], last_number(entry)
        if last < first:
            continue
        at = 0
        for _ in range(first - (last - text.count("\n"))):  # in the first entry kept only
            at = text.index("\n", at) + 1
        parts.append(text[at:] if at else text)
    return "\n".join(parts) + "\n" if parts else ""


def last_number(entry: Entry) -> int:
    """The number of the entry's last line (numbered streams only)."""
    return position(entry[0])[1]


def extent(info: Mapping[str, Any]) -> tuple[int, int]:
    """(lines kept, lines ever given) of a stream, from its XINFO STREAM reply
    (its length and entries-added, its first and last entries)."""
    first, last = info.get("first-entry"), info.get("last-entry")
    if not first or not last:
        return 0, 0
    if is_legacy(last):
        length = int(info["length"])
        return length, max(length, int(info.get("entries-added") or length))
    added = last_number(last)
    return added - position(entry_lines(first)[0][0])[1] + 1, added
