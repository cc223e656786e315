"""A terminal session's keys in a real Redis (shared/state/execsessions.py): the
claim, the bounds both ways, and nothing left once it ended."""

from __future__ import annotations

import pytest
import redis

from shared.state import execsessions, keys
from shared.state.execsessions import EndReason, Refusal, Resize, Sessions, TtyRequest

pytestmark = pytest.mark.redis


def _request(node: str = "n1") -> TtyRequest:
    return TtyRequest.new(job_id="alice~j", attempt=0, role="main", index=0, node=node,
                          argv=["/bin/sh"], timeout_seconds=60, user="alice", cols=80, rows=24,
                          idle_seconds=900.0)


def _open(r: redis.Redis, request: TtyRequest) -> None:
    pipe = r.pipeline(transaction=True)
    execsessions.write_request(pipe, request)
    pipe.execute()


def _session_keys(r: redis.Redis) -> list[str]:
    return sorted(str(k) for k in r.scan_iter(match=f"{keys.PREFIX}exec-tty:*"))


def test_a_session_is_claimed_once_and_only_by_its_node(redis_client: redis.Redis) -> None:
    sessions, request = Sessions(redis_client), _request()
    _open(redis_client, request)

    assert sessions.claim(request.id, "n2", "n2") is None  # another node's message
    assert sessions.claim(request.id, "n1", "n1") == request
    assert sessions.claim(request.id, "n1", "n1") is None  # delivered again
    assert sessions.claim("no-such-session", "n1", "n1") is None


def test_input_waits_when_the_node_is_behind(redis_client: redis.Redis) -> None:
    sessions, request = Sessions(redis_client), _request()
    _open(redis_client, request)
    for i in range(execsessions.INPUT_MAX_ENTRIES):
        assert sessions.push_input(request.id, execsessions.input_data(bytes([i]))) == 1

    full = execsessions.input_data(b"one too many")
    assert sessions.push_input(request.id, full) == 0  # back-pressure, not dropped
    taken = sessions.take_input(request.id, 1.0)
    assert taken == [bytes([i]) for i in range(execsessions.INPUT_MAX_ENTRIES)]
    assert sessions.push_input(request.id, full) == 1
    assert sessions.push_input(request.id, execsessions.input_resize(Resize(90, 30))) == 1
    assert sessions.take_input(request.id, 1.0) == [b"one too many", Resize(90, 30)]
    assert sessions.take_input(request.id, 0.05) == []  # nothing waiting: the wait ends


def test_output_waits_when_the_client_is_behind(redis_client: redis.Redis) -> None:
    sessions, request = Sessions(redis_client), _request()
    _open(redis_client, request)
    for i in range(execsessions.OUTPUT_MAX_ENTRIES):
        assert sessions.put_data(request.id, bytes([i % 256]) * 10) == 1

    assert sessions.put_data(request.id, b"more") == 0  # the launcher stops reading
    read = sessions.read_output(request.id, "0-0", 100)
    assert [e.data for e in read] == [bytes([i % 256]) * 10 for i in range(len(read))]
    sessions.delivered(request.id, [e.id for e in read])
    assert sessions.put_data(request.id, b"more") == 1


def test_nothing_is_written_for_a_session_that_is_gone(redis_client: redis.Redis) -> None:
    sessions, request = Sessions(redis_client), _request()
    _open(redis_client, request)
    sessions.close(request.id)  # the client left

    assert sessions.push_input(request.id, execsessions.input_data(b"x")) == -1
    assert sessions.put_data(request.id, b"late output") == -1
    assert not sessions.beat(request.id, 1)
    sessions.end(request.id, 0, EndReason.CLIENT_GONE)
    assert _session_keys(redis_client) == []


def test_the_end_is_told_and_the_other_keys_go(redis_client: redis.Redis) -> None:
    sessions, request = Sessions(redis_client), _request()
    _open(redis_client, request)
    sessions.push_input(request.id, execsessions.input_data(b"unread"))
    sessions.put_output(request.id, {"started": "1"})

    sessions.end(request.id, 3, EndReason.EXITED)

    assert _session_keys(redis_client) == [keys.exec_session_output(request.id)]
    assert 0 < redis_client.pttl(keys.exec_session_output(request.id)) \
        <= execsessions.SESSION_TTL_SECONDS * 1000
    read = sessions.read_output(request.id, "0-0", 100)
    assert read[0].started and (read[1].ended, read[1].exit_code) == (EndReason.EXITED, 3)


def test_every_key_expires(redis_client: redis.Redis) -> None:
    sessions, request = Sessions(redis_client), _request()
    _open(redis_client, request)
    sessions.push_input(request.id, execsessions.input_data(b"x"))
    sessions.refuse(request.id, Refusal.BUSY, "full")

    assert all(0 < redis_client.ttl(k) <= execsessions.SESSION_TTL_SECONDS
               for k in _session_keys(redis_client))
    assert len(_session_keys(redis_client)) == 3
    fields = sessions.renew(request.id)
    assert fields is not None and fields["user"] == "alice"
