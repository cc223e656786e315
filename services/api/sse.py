"""Server-sent event frames, built so that nothing a job prints can forge one.

A job controls its log lines, and a log line goes into a frame. The HTML
standard ends a field at CR, at LF and at CRLF, so a line that carries any
of them could close its `data` field early and start a field or an event of
its own (`hello\\rdata: forged\\r\\revent: x`). Here every CR, LF and CRLF
inside a value starts another `data` field instead: a standard client joins
the fields with LF, so the line comes back as one event, its breaks shown as
LF (a frame cannot carry a CR at all). Ids and event names are one-line
values the platform makes; one that holds a break or a NUL is refused
rather than sent.

Log line ids are Redis stream ids; a `Last-Event-ID` a client sends back
must be one Redis would accept, or the follow would fail after its 200.
"""

from __future__ import annotations

import re

LINE_BREAK = re.compile(r"\r\n|\r|\n")
_STREAM_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})\Z")
MAX_STREAM_PART = 2**64 - 1  # each half of a Redis stream id is an unsigned 64-bit number


def frame(data: str, *, event_id: str | None = None, event: str | None = None) -> str:
    """One event: optional `event` and `id` fields, then the data, then a blank line."""
    fields = []
    if event is not None:
        fields.append(f"event: {_one_line('event', event)}\n")
    if event_id is not None:
        fields.append(f"id: {_one_line('id', event_id)}\n")
    fields.extend(f"data: {part}\n" for part in LINE_BREAK.split(data))
    return "".join(fields) + "\n"


def comment(text: str) -> str:
    """A comment (a keep-alive): clients skip it, proxies see traffic."""
    return "".join(f": {part}\n" for part in LINE_BREAK.split(text)) + "\n"


def _one_line(name: str, value: str) -> str:
    if LINE_BREAK.search(value) or "\0" in value:
        raise ValueError(f"an SSE {name} must be one line without NUL, got {value!r}")
    return value


def parse_stream_id(raw: str) -> str | None:
    """`raw` if it is an id Redis accepts for a stream entry (ms-seq), else None."""
    found = _STREAM_ID.match(raw)
    if found is None:
        return None
    if any(int(part) > MAX_STREAM_PART for part in found.groups()):
        return None
    return raw
