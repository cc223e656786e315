"""The pure parts of interactive exec (shared/state/execsessions.py, and the
API's parser of its control messages, ControlMessageSchema): control
messages, window sizes, the input entries, and when a session must end."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.api.exectty import parse_control
from shared.state import execsessions
from shared.state.execsessions import (
    ControlError,
    EndReason,
    Entry,
    Refusal,
    Resize,
    Start,
    TtyRequest,
)


@pytest.mark.parametrize(("text", "parsed"), [
    ('{"type": "resize", "cols": 120, "rows": 40}', Resize(120, 40)),
    ('{"type": "start"}', Start(None, None)),
    ('{"type": "start", "command": ["bash", "-l"]}', Start(["bash", "-l"], None)),
    ('{"type": "start", "command": ["sh"], "cols": 80, "rows": 24}',
     Start(["sh"], Resize(80, 24))),
    ('{"type": "resize", "cols": 10000, "rows": 1}', Resize(10000, 1)),
])
def test_control_messages(text: str, parsed: Resize | Start) -> None:
    assert parse_control(text) == parsed


@pytest.mark.parametrize(("text", "problem"), [
    ("not json", "JSON object"),
    ("[1, 2]", "JSON object"),
    ('{"type": "kill"}', "unknown message type"),
    ('{"cols": 1, "rows": 1}', "unknown message type"),
    ('{"type": "resize", "cols": 0, "rows": 24}', "cols must be between"),
    ('{"type": "resize", "cols": 80, "rows": 10001}', "rows must be between"),
    ('{"type": "resize", "cols": 80.5, "rows": 24}', "cols must be a whole number"),
    ('{"type": "resize", "cols": true, "rows": 24}', "cols must be a whole number"),
    ('{"type": "resize", "cols": "80", "rows": 24}', "cols must be a whole number"),
    ('{"type": "resize", "cols": 80}', "rows must be a whole number"),
    ('{"type": "start", "command": "bash"}', "list of strings"),
    ('{"type": "start", "command": [1]}', "list of strings"),
    ('{"type": "start", "command": []}', "at least one argument"),
    ('{"type": "start", "command": ["a\\u0000b"]}', "NUL"),
    ('{"type": "start", "cols": 80}', "rows must be a whole number"),
])
def test_control_messages_refused(text: str, problem: str) -> None:
    with pytest.raises(ControlError, match=problem):
        parse_control(text)


def test_a_control_message_is_bounded() -> None:
    text = json.dumps({"type": "start", "command": ["x" * execsessions.MAX_CONTROL_BYTES]})
    with pytest.raises(ControlError, match="at most"):
        parse_control(text)


@given(st.binary(max_size=4096))
def test_keystrokes_survive_the_input_list(data: bytes) -> None:
    entry = execsessions.input_data(data)
    # Redis stores the text as UTF-8 and hands it back decoded
    assert execsessions.parse_input(entry.encode().decode()) == data


@given(st.integers(1, execsessions.MAX_WINDOW), st.integers(1, execsessions.MAX_WINDOW))
def test_resizes_survive_the_input_list(cols: int, rows: int) -> None:
    assert execsessions.parse_input(execsessions.input_resize(Resize(cols, rows))) == \
        Resize(cols, rows)


@given(st.binary(max_size=4096))
def test_output_survives_the_stream(data: bytes) -> None:
    assert Entry.from_fields("1-0", {"d": data.decode("latin-1")}).data == data


@pytest.mark.parametrize(("fields", "entry"), [
    ({"started": "1"}, Entry("1-0", started=True)),
    ({"refused": "busy", "message": "full"}, Entry("1-0", refused=Refusal.BUSY, message="full")),
    ({"exit": "3", "reason": "exited"}, Entry("1-0", ended=EndReason.EXITED, exit_code=3)),
    ({"exit": "-1", "reason": "exited"}, Entry("1-0", ended=EndReason.EXITED, exit_code=-1)),
    ({"exit": "", "reason": "idle"}, Entry("1-0", ended=EndReason.IDLE)),
])
def test_output_entries(fields: dict[str, str], entry: Entry) -> None:
    assert Entry.from_fields("1-0", fields) == entry


# now, started, last byte, idle limit, longest length -> why it ends now
@pytest.mark.parametrize(("now", "started", "last", "idle", "longest", "reason"), [
    (10.0, 0.0, 9.0, 900.0, 3600.0, None),
    (10.0, 0.0, 0.0, 10.0, 3600.0, EndReason.IDLE),
    (10.0, 0.0, 0.5, 10.0, 3600.0, None),
    (3600.0, 0.0, 3599.0, 900.0, 3600.0, EndReason.MAX_DURATION),
    # both at once: the longest length is the one that names it
    (3600.0, 0.0, 0.0, 900.0, 3600.0, EndReason.MAX_DURATION),
])
def test_when_a_session_ends(now: float, started: float, last: float, idle: float,
                             longest: float, reason: EndReason | None) -> None:
    assert execsessions.end_reason(now, started, last, idle, longest) == reason


@pytest.mark.parametrize(("now", "started", "beat", "lost"), [
    (40_000, 0, None, True),  # never a beat, past the limit since the start
    (20_000, 0, None, False),
    (100_000, 0, 80_000, False),
    (100_000, 0, 60_000, True),
])
def test_when_the_node_is_lost(now: int, started: int, beat: int | None, lost: bool) -> None:
    assert execsessions.node_lost(now, started, beat) is lost


def test_a_request_round_trips_through_its_hash() -> None:
    request = TtyRequest.new(job_id="alice~j", attempt=2, role="main", index=1, node="n1",
                             argv=["sh", "-c", "echo 'a b'"], timeout_seconds=43200,
                             user="alice", cols=132, rows=50, idle_seconds=12.5)
    assert TtyRequest.from_fields(request.id, request.to_fields()) == request


def test_the_exit_message() -> None:
    assert json.loads(execsessions.exit_message(3, EndReason.EXITED)) == \
        {"type": "exit", "exitCode": 3, "reason": "exited"}
    assert json.loads(execsessions.exit_message(None, EndReason.IDLE, "no byte for 900 s")) == \
        {"type": "exit", "exitCode": None, "reason": "idle", "message": "no byte for 900 s"}
