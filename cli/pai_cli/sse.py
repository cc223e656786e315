"""Server-sent events, parsed from lines as they arrive (the log follow stream).

The rules of the HTML standard that matter here: an event is the fields up
to a blank line; `data` fields join with newlines; one space after the colon
is dropped; a line starting with a colon is a comment (a keep-alive).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    event: str
    data: str


def parse_events(lines: Iterable[str]) -> Iterator[Event]:
    """Events from decoded lines (with or without their line endings)."""
    event, has_data = "", False
    data: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line:
            if has_data or event:
                yield Event(event or "message", "\n".join(data))
            event, data, has_data = "", [], False
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data.append(value)
            has_data = True
        elif name == "event":
            event = value
    if has_data:
        yield Event(event or "message", "\n".join(data))
