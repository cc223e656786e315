"""The pure parts of exec: argv rules, the output cap, Docker's frames, the
cgroup check before a kill, and the request body's schema."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from marshmallow import ValidationError

from services.api.execschemas import ExecRequestSchema
from shared.state import execs
from shared.state.execs import ExecRequest, ExecResult, Outcome, OutputCap, demux, in_container

CONTAINER = "65139d40e65f8ad18d90816a770539312135f56a0be5e9dac66afd96f8ca8aa4"
OTHER = "0" * 64


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(payload)) + payload


# ------------------------------------------------------------------ argv


@pytest.mark.parametrize(("argv", "problem"), [
    ([], "at least one argument"),
    ([""], "program name must not be empty"),
    (["sh", "-c", "echo a\0b"], "NUL"),
    (["x"] * (execs.MAX_ARGS + 1), f"at most {execs.MAX_ARGS} arguments"),
    (["echo", "a" * execs.MAX_ARGV_BYTES], "KiB"),
    (["echo", "é" * (execs.MAX_ARGV_BYTES // 2)], "KiB"),  # bytes, not characters
])
def test_argv_refused(argv: list[str], problem: str) -> None:
    assert any(problem in p for p in execs.argv_problems(argv))


@pytest.mark.parametrize("argv", [
    ["nvidia-smi"], ["sh", "-c", "ls; echo $HOME"], ["echo", ""], ["printf", "%s\n", "ünï"],
    ["echo", "a" * (execs.MAX_ARGV_BYTES - 4)],
])
def test_argv_accepted(argv: list[str]) -> None:
    assert execs.argv_problems(argv) == []


# ------------------------------------------------------------ output cap


@pytest.mark.parametrize(("chunks", "limit", "kept", "truncated"), [
    ([b"hello"], 10, b"hello", False),
    ([b"hello", b"world"], 10, b"helloworld", False),
    ([b"hello", b"world!"], 10, b"helloworld", True),
    ([b"a" * 20], 10, b"a" * 10, True),
    ([b"", b""], 10, b"", False),
    ([b"abc", b"def"], 0, b"", True),
])
def test_output_cap(chunks: list[bytes], limit: int, kept: bytes, truncated: bool) -> None:
    cap = OutputCap(limit)
    for chunk in chunks:
        cap.feed(chunk)
    assert bytes(cap.kept) == kept
    assert cap.truncated is truncated


def test_a_character_the_cap_cuts_shows_as_a_replacement() -> None:
    cap = OutputCap(2)
    cap.feed("aé".encode())  # 'é' is two bytes: the cap keeps 'a' and half of it
    assert cap.text() == "a\N{REPLACEMENT CHARACTER}"
    assert cap.truncated


@given(st.lists(st.binary(max_size=50), max_size=20), st.integers(0, 200))
def test_the_cap_keeps_a_prefix_of_at_most_its_limit(chunks: list[bytes], limit: int) -> None:
    cap = OutputCap(limit)
    for chunk in chunks:
        cap.feed(chunk)
    whole = b"".join(chunks)
    assert bytes(cap.kept) == whole[:limit]
    assert cap.truncated == (len(whole) > limit)


# ----------------------------------------------------------------- frames


def test_demux_cuts_frames_and_keeps_the_incomplete_rest() -> None:
    data = frame(1, b"out\n") + frame(2, b"err\n") + frame(1, b"partial")[:6]
    frames, rest = demux(data)
    assert frames == [(1, b"out\n"), (2, b"err\n")]
    assert rest == frame(1, b"partial")[:6]


def test_demux_of_an_empty_frame_and_of_nothing() -> None:
    assert demux(frame(1, b"")) == ([(1, b"")], b"")
    assert demux(b"") == ([], b"")


@given(st.lists(st.tuples(st.sampled_from([1, 2]), st.binary(max_size=300)), max_size=10),
       st.lists(st.integers(1, 64), max_size=50))
def test_demux_gives_the_frames_however_the_stream_is_cut(
        sent: list[tuple[int, bytes]], cuts: list[int]) -> None:
    stream = b"".join(frame(s, p) for s, p in sent)
    got: list[tuple[int, bytes]] = []
    pending, position = b"", 0
    for size in [*cuts, len(stream)]:
        chunk, position = stream[position:position + size], position + size
        frames, pending = demux(pending + chunk)
        got.extend(frames)
    assert got == sent
    assert pending == b""


# ----------------------------------------------------------------- cgroup


@pytest.mark.parametrize(("text", "inside"), [
    # cgroup v1, cgroupfs driver
    (f"9:name=systemd:/docker/{CONTAINER}\n8:pids:/docker/{CONTAINER}\n0::/docker/{CONTAINER}\n",
     True),
    # cgroup v2, systemd driver
    (f"0::/system.slice/docker-{CONTAINER}.scope\n", True),
    # a process of the container's own sub-cgroup
    (f"0::/docker/{CONTAINER}/init\n", True),
    # another container's process
    (f"0::/docker/{OTHER}\n", False),
    # a host process (the PID was reused)
    ("0::/\n", False),
    ("0::/user.slice/user-0.slice/session-1.scope\n", False),
    # only some lines name the container
    (f"8:pids:/docker/{CONTAINER}\n4:memory:/\n", False),
    # the id as part of a longer name is not the container
    (f"0::/docker/{CONTAINER}ff\n", False),
    (f"0::/docker/x{CONTAINER}\n", False),
    ("", False),
])
def test_in_container(text: str, inside: bool) -> None:
    assert in_container(text, CONTAINER) is inside


@pytest.mark.parametrize("container_id", ["", "abc", CONTAINER[:12], ".*", CONTAINER.upper()])
def test_in_container_wants_a_full_id(container_id: str) -> None:
    assert not in_container(f"0::/docker/{container_id}\n", container_id)


# --------------------------------------------------------------- records


def request(answer_by_ms: int = 0) -> ExecRequest:
    return ExecRequest.new(job_id="alice~j", attempt=2, role="main", index=1, node="n1",
                           argv=["sh", "-c", "echo 'x y'"], timeout_seconds=30, user="root",
                           answer_by_ms=answer_by_ms)


@pytest.mark.parametrize("answer_by_ms", [0, 1_700_000_040_000])
def test_request_and_result_survive_redis(answer_by_ms: int) -> None:
    sent = request(answer_by_ms)
    assert ExecRequest.from_fields(sent.id, sent.to_fields()) == sent
    result = ExecResult(Outcome.DONE, 3, "out\nerr\n", truncated=True, timed_out=False)
    assert ExecResult.from_json(result.to_json()) == result


# ----------------------------------------------------------------- schema


@pytest.mark.parametrize(("body", "loaded"), [
    ({"command": ["ls"]}, {"command": ["ls"], "timeoutSec": execs.DEFAULT_TIMEOUT_SECONDS}),
    ({"command": ["sh", "-c", "x"], "timeoutSec": 1},
     {"command": ["sh", "-c", "x"], "timeoutSec": 1}),
    ({"command": ["ls"], "timeoutSec": 600}, {"command": ["ls"], "timeoutSec": 600}),
])
def test_schema_loads(body: dict[str, Any], loaded: dict[str, Any]) -> None:
    assert ExecRequestSchema(max_timeout=600).load(body) == loaded


@pytest.mark.parametrize(("body", "field"), [
    ({}, "command"),
    ({"command": []}, "command"),
    ({"command": "ls -l"}, "command"),
    ({"command": [1, 2]}, "command"),
    ({"command": [None]}, "command"),
    ({"command": ["ls", {"a": 1}]}, "command"),
    ({"command": ["echo", "a\0"]}, "command"),
    ({"command": [""]}, "command"),
    ({"command": ["x"] * (execs.MAX_ARGS + 1)}, "command"),
    ({"command": ["ls"], "timeoutSec": 0}, "timeoutSec"),
    ({"command": ["ls"], "timeoutSec": -5}, "timeoutSec"),
    ({"command": ["ls"], "timeoutSec": 601}, "timeoutSec"),  # the platform's setting
    ({"command": ["ls"], "timeoutSec": execs.MAX_TIMEOUT_SECONDS + 1}, "timeoutSec"),
    ({"command": ["ls"], "timeoutSec": "30"}, "timeoutSec"),
    ({"command": ["ls"], "timeoutSec": 1.5}, "timeoutSec"),
    ({"command": ["ls"], "timeoutSec": True}, "timeoutSec"),
    ({"command": ["ls"], "tty": True}, "tty"),  # unknown fields are refused
])
def test_schema_refuses(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ExecRequestSchema(max_timeout=600).load(body)
    assert field in refused.value.messages


def test_a_request_of_an_earlier_api_version_reads_as_never_abandoned() -> None:
    fields = request(1_700_000_040_000).to_fields()
    del fields["answer_by"]
    assert ExecRequest.from_fields("r1", fields).answer_by_ms == 0


@pytest.mark.parametrize(("answer_by_ms", "now_ms", "abandoned"), [
    (1_000, 999, False),
    (1_000, 1_000, False),  # the API's last moment
    (1_000, 1_001, True),
    (0, 10**13, False),  # an earlier API version's request: no deadline
])
def test_a_request_is_abandoned_once_its_answer_is_no_longer_awaited(
        answer_by_ms: int, now_ms: int, abandoned: bool) -> None:
    assert request(answer_by_ms).abandoned(now_ms) is abandoned


def test_answer_waits_past_the_timeout() -> None:
    assert execs.answer_seconds(30, 10.0) == 40.0
