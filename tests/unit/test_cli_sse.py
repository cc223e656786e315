"""Server-sent events as the log follow stream sends them."""

from __future__ import annotations

import pytest

from pai_cli.sse import Event, parse_events


@pytest.mark.parametrize(("lines", "events"), [
    pytest.param(["data: hello\n", "\n"], [Event("message", "hello")], id="one line"),
    pytest.param(["data: a\n", "\n", "data: b\n", "\n", "event: end\n", "data: \n", "\n"],
                 [Event("message", "a"), Event("message", "b"), Event("end", "")],
                 id="lines then the end event"),
    pytest.param(["data: one\n", "data: two\n", "\n"], [Event("message", "one\ntwo")],
                 id="data fields join with newlines"),
    pytest.param(["data:  two spaces\r\n", "\r\n"], [Event("message", " two spaces")],
                 id="one space dropped, CRLF"),
    pytest.param(["data:x\n", "\n"], [Event("message", "x")], id="no space"),
    pytest.param([": keep-alive\n", "\n", "data: x\n", "\n"], [Event("message", "x")],
                 id="comments are skipped"),
    pytest.param(["data: a: b\n", "\n"], [Event("message", "a: b")], id="colons in data"),
    pytest.param(["data: cut\n"], [Event("message", "cut")], id="end of stream flushes"),
    pytest.param(["\n", "\n", "id: 3\n", "\n"], [], id="nothing to dispatch"),
    pytest.param(["data\n", "\n"], [Event("message", "")], id="field with no colon"),
])
def test_parse_events(lines: list[str], events: list[Event]) -> None:
    assert list(parse_events(lines)) == events
