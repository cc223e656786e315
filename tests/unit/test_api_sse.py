"""Server-sent event frames (services/api/sse.py) and the Last-Event-ID a client
may send back.

Threat: a job controls its log lines, and every line goes into a frame; a CR,
an LF or a CRLF in a line must never end its data field and start a field or
an event of the job's choosing (a forged line, a forged end of the log).
The frames are read back with the HTML standard's line rules (CR, LF and
CRLF all end a line) and the CLI's parser of the fields.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pai_cli.sse import Event, parse_events
from services.api.sse import LINE_BREAK, comment, frame, parse_stream_id


def events_of(stream: str) -> list[Event]:
    """Events as a standard client sees them: lines end at CRLF, CR or LF."""
    return list(parse_events(re.split(r"\r\n|\r|\n", stream)))


def test_a_bare_cr_in_a_line_cannot_forge_a_field_or_an_event() -> None:
    """Threat: a log line `hello\\rdata: forged\\r\\revent: x` injects an event."""
    line = "hello\rdata: forged\r\revent: x"

    events = events_of(frame(line, event_id="1700000000000-0"))

    assert events == [Event("message", "hello\ndata: forged\n\nevent: x")]


@pytest.mark.parametrize(("line", "data"), [
    pytest.param("plain", "plain", id="plain"),
    pytest.param("", "", id="empty"),
    pytest.param("a\nb", "a\nb", id="LF"),
    pytest.param("a\r\nb", "a\nb", id="CRLF"),
    pytest.param("a\rb", "a\nb", id="bare CR"),
    pytest.param("a\n\rb", "a\n\nb", id="LF then CR: two breaks"),
    pytest.param("\r", "\n", id="only a CR"),
    pytest.param("x\n\nevent: end\ndata: ", "x\n\nevent: end\ndata: ",
                 id="a forged end event stays data"),
    pytest.param(" lead", " lead", id="a leading space is kept"),
    pytest.param(": not a comment", ": not a comment", id="a colon first is data"),
    pytest.param("id: 9-9", "id: 9-9", id="a forged id stays data"),
])
def test_every_line_is_one_event_with_its_breaks_as_lf(line: str, data: str) -> None:
    stream = frame(line, event_id="5-0") + frame("", event="end")

    assert events_of(stream) == [Event("message", data), Event("end", "")]


def test_the_cli_reading_lf_only_lines_sees_the_same_event() -> None:
    """The CLI splits the stream at LF only; no CR is left for it to misread."""
    body = frame("hello\rdata: forged\r\revent: x", event_id="1-0")

    assert "\r" not in body
    assert list(parse_events(body.splitlines(keepends=True))) == [
        Event("message", "hello\ndata: forged\n\nevent: x")]


@given(st.text())
def test_any_text_is_exactly_one_event(text: str) -> None:
    assert events_of(frame(text, event_id="1-0")) == [
        Event("message", LINE_BREAK.sub("\n", text))]


@pytest.mark.parametrize("value", ["a\nb", "a\rb", "a\r\nb", "a\0b"])
@pytest.mark.parametrize("field", ["event", "event_id"])
def test_ids_and_event_names_with_a_break_or_nul_are_refused(field: str, value: str) -> None:
    with pytest.raises(ValueError, match="one line"):
        frame("x", **{field: value})


def test_a_comment_stays_a_comment() -> None:
    assert events_of(comment("keep-alive\rdata: forged")) == []


@pytest.mark.parametrize(("raw", "valid"), [
    pytest.param("1700000000000-0", True, id="a stream id"),
    pytest.param("0-0", True, id="zero"),
    pytest.param("18446744073709551615-18446744073709551615", True, id="the largest"),
    pytest.param("18446744073709551616-0", False, id="ms past 64 bits"),
    pytest.param("1-18446744073709551616", False, id="seq past 64 bits"),
    pytest.param("99999999999999999999-0", False, id="20 nines"),
    pytest.param("1" * 5000 + "-0", False, id="huge"),
    pytest.param("1", False, id="no sequence"),
    pytest.param("1-", False, id="empty sequence"),
    pytest.param("-1-0", False, id="negative"),
    pytest.param("1-0\n", False, id="trailing newline"),
    pytest.param("\u0661-\u0660", False, id="arabic-indic digits"),
    pytest.param("$", False, id="the new-entries id"),
    pytest.param("", False, id="empty"),
])
def test_a_last_event_id_is_a_stream_id_redis_accepts(raw: str, valid: bool) -> None:
    assert (parse_stream_id(raw) == raw) is valid
