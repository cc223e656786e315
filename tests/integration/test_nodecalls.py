"""A node's calls (exec requests, terminal sessions) on a real Redis: sent in
the transaction that records the request, read through the consumer group at
least once, and the launcher's feed that hands each to its handler."""

from __future__ import annotations

import queue
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
import redis

from services.launcher.calls import CallFeed
from shared.state import keys, nodecalls
from shared.state.nodecalls import Call, CallReader, Kind, TaskAt
from shared.state.nodestreams import GROUP, MAX_ENTRIES
from tests.support.polling import WAIT_SECONDS, wait_for
from tests.support.threads import looping

pytestmark = pytest.mark.redis

NODE = "gpu-01"


@pytest.fixture
def reader(redis_client: redis.Redis) -> CallReader:
    reader = CallReader(redis_client, NODE)
    reader.join()
    return reader


def send(r: redis.Redis, *calls: tuple[Kind, str]) -> None:
    pipe = r.pipeline(transaction=True)
    for kind, request_id in calls:
        nodecalls.send(pipe, NODE, kind, request_id)
    pipe.execute()


def pending_count(r: redis.Redis) -> int:
    return int(r.xpending(keys.node_calls(NODE), GROUP)["pending"])


def test_a_call_sent_with_its_request_is_read_once(redis_client: redis.Redis,
                                                   reader: CallReader) -> None:
    pipe = redis_client.pipeline(transaction=True)
    pipe.hset("pai:test:request", "node", NODE)
    nodecalls.send(pipe, NODE, Kind.EXEC, "r1")
    nodecalls.send(pipe, NODE, Kind.TTY, "s1")
    pipe.execute()

    taken = reader.take(10, 100)

    assert [(c.kind, c.request_id) for c in taken] == [(Kind.EXEC, "r1"), (Kind.TTY, "s1")]
    assert reader.take(10, 100) == []
    assert pending_count(redis_client) == 2  # until done
    reader.done([c.id for c in taken])
    assert redis_client.xlen(keys.node_calls(NODE)) == 0


def test_an_entry_that_does_not_parse_names_no_kind() -> None:
    assert nodecalls.parse("1-0", None) == Call("1-0")
    assert nodecalls.parse("1-0", {"kind": "format-disk", "id": "r1"}) == Call("1-0")
    assert nodecalls.parse("1-0", {"id": "r1"}) == Call("1-0")
    assert nodecalls.parse("1-0", {"kind": "exec", "id": "r1"}) == Call("1-0", Kind.EXEC, "r1")


def test_an_entry_names_its_task_only_in_full() -> None:
    task = {"job": "alice~train", "attempt": "2", "role": "main", "index": "1"}
    assert nodecalls.parse("1-0", {"kind": "exec", "id": "r1", **task}) == Call(
        "1-0", Kind.EXEC, "r1", TaskAt("alice~train", 2, "main", 1))
    for partial in ({**task, "attempt": "two"}, {k: v for k, v in task.items() if k != "role"}):
        assert nodecalls.parse("1-0", {"kind": "exec", "id": "r1", **partial}) == Call(
            "1-0", Kind.EXEC, "r1")


def test_a_call_sent_with_its_task_is_read_with_it(redis_client: redis.Redis,
                                                   reader: CallReader) -> None:
    pipe = redis_client.pipeline(transaction=True)
    nodecalls.send(pipe, NODE, Kind.EXEC, "r1", TaskAt("alice~train", 0, "main", 3))
    pipe.execute()

    [call] = reader.take(10, 100)

    assert call.task == TaskAt("alice~train", 0, "main", 3)


def test_the_stream_of_a_node_no_launcher_reads_is_bounded(redis_client: redis.Redis) -> None:
    for i in range(MAX_ENTRIES * 2):
        send(redis_client, (Kind.EXEC, f"r{i}"))

    assert redis_client.xlen(keys.node_calls(NODE)) < MAX_ENTRIES * 2


# ------------------------------------------------------------------ the feed


class Handler:
    """A handler: records each request id; raises, once, for those told to."""

    def __init__(self, fail_once: dict[str, Exception] | None = None) -> None:
        self.calls: queue.Queue[str] = queue.Queue()
        self.fail_once = dict(fail_once or {})

    def __call__(self, call: Call) -> None:
        self.calls.put(call.request_id)
        error = self.fail_once.pop(call.request_id, None)
        if error is not None:
            raise error

    def next(self) -> str:
        return self.calls.get(timeout=WAIT_SECONDS)


@pytest.fixture
def running_feed(reader: CallReader) -> Iterator[Callable[[Handler, Handler], CallFeed]]:
    with ExitStack() as feeds:
        def run(execs: Handler, ttys: Handler) -> CallFeed:
            feed = CallFeed(reader, {Kind.EXEC: execs, Kind.TTY: ttys}, block_ms=100)
            feeds.enter_context(looping(feed.run))
            return feed

        yield run


def emptied(r: redis.Redis) -> None:
    wait_for(lambda: r.xlen(keys.node_calls(NODE)) == 0, "the feed to finish its entries")


def test_each_call_goes_to_its_kinds_handler_and_its_entry_is_deleted(
        redis_client: redis.Redis, running_feed: Callable[[Handler, Handler], CallFeed]) -> None:
    execs, ttys = Handler(), Handler()
    running_feed(execs, ttys)

    send(redis_client, (Kind.EXEC, "r1"), (Kind.TTY, "s1"), (Kind.EXEC, "r2"))

    assert [execs.next(), execs.next(), ttys.next()] == ["r1", "r2", "s1"]
    emptied(redis_client)
    assert pending_count(redis_client) == 0


def test_a_call_a_predecessor_took_and_did_not_finish_is_handled(
        redis_client: redis.Redis, reader: CallReader,
        running_feed: Callable[[Handler, Handler], CallFeed]) -> None:
    send(redis_client, (Kind.EXEC, "r1"))
    assert len(reader.take(10, 100)) == 1  # the launcher before was killed here
    execs = Handler()

    running_feed(execs, Handler())

    assert execs.next() == "r1"
    emptied(redis_client)


def test_a_handler_that_lost_redis_leaves_its_call_and_those_after_it_pending(
        redis_client: redis.Redis, running_feed: Callable[[Handler, Handler], CallFeed]) -> None:
    execs = Handler({"r1": redis.ConnectionError("link down")})
    running_feed(execs, Handler())

    send(redis_client, (Kind.EXEC, "r1"), (Kind.EXEC, "r2"))

    # r1 failed; after the feed's pause, both are read again from pending
    assert [execs.next(), execs.next(), execs.next()] == ["r1", "r1", "r2"]
    emptied(redis_client)
    assert execs.calls.empty()


def test_a_handler_that_failed_otherwise_drops_its_call_only(
        redis_client: redis.Redis, running_feed: Callable[[Handler, Handler], CallFeed]) -> None:
    execs = Handler({"r1": RuntimeError("a bug")})
    running_feed(execs, Handler())

    send(redis_client, (Kind.EXEC, "r1"), (Kind.EXEC, "r2"))

    assert [execs.next(), execs.next()] == ["r1", "r2"]
    emptied(redis_client)
    assert pending_count(redis_client) == 0
    assert execs.calls.empty()


def test_a_pending_call_trimmed_away_is_dropped(
        redis_client: redis.Redis, reader: CallReader,
        running_feed: Callable[[Handler, Handler], CallFeed]) -> None:
    send(redis_client, (Kind.EXEC, "r1"))
    assert len(reader.take(10, 100)) == 1
    redis_client.xtrim(keys.node_calls(NODE), maxlen=0)
    execs = Handler()

    running_feed(execs, Handler())
    send(redis_client, (Kind.EXEC, "r2"))  # handled after the recovery

    assert execs.next() == "r2"
    wait_for(lambda: pending_count(redis_client) == 0, "the trimmed call dropped")
    assert execs.calls.empty()
