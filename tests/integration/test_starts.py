"""A node's stream of starts on a real Redis: at-least-once delivery through
the consumer group, and the launcher's feed that starts what it takes."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
import redis

from services.launcher.starts import StartFeed
from shared.state import keys, starts
from shared.state.nodestreams import GROUP, MAX_ENTRIES
from shared.state.starts import StartReader, StartRef
from tests.support.threads import looping

pytestmark = pytest.mark.redis

NODE = "gpu-01"
A: StartRef = ("alice~a", 0, "main", 0)
B: StartRef = ("alice~b", 2, "worker", 3)
C: StartRef = ("bob~c", 0, "main", 0)
WAIT_SECONDS = 10
HOLD_SECONDS = 6 * WAIT_SECONDS  # a held start outlasts every wait of the test


@pytest.fixture
def reader(redis_client: redis.Redis) -> StartReader:
    reader = StartReader(redis_client, NODE)
    reader.join()
    return reader


def pending_count(r: redis.Redis) -> int:
    return int(r.xpending(keys.node_starts(NODE), GROUP)["pending"])


def test_a_send_is_one_entry_per_node_naming_its_tasks(redis_client: redis.Redis,
                                                       reader: StartReader) -> None:
    starts.send(redis_client, {NODE: [A, B], "gpu-02": [C], "gpu-03": []})

    taken = reader.take(10, 100)

    assert [e.tasks for e in taken] == [(A, B)]
    assert [e.tasks for e in StartReader(redis_client, "gpu-02").pending(10)] == []  # no group yet
    assert not redis_client.exists(keys.node_starts("gpu-03"))


def test_entries_sent_before_any_launcher_joined_are_read(redis_client: redis.Redis) -> None:
    starts.send(redis_client, {NODE: [A]})
    reader = StartReader(redis_client, NODE)

    reader.join()
    reader.join()  # a second launcher (a restart) joins the same group

    assert [e.tasks for e in reader.take(10, 100)] == [(A,)]


def test_an_entry_taken_and_not_done_stays_pending_until_done(redis_client: redis.Redis,
                                                              reader: StartReader) -> None:
    starts.send(redis_client, {NODE: [A]})
    starts.send(redis_client, {NODE: [B]})
    first, second = reader.take(10, 100)

    assert reader.take(10, 100) == []  # taken once
    assert [e.tasks for e in reader.pending(10)] == [(A,), (B,)]
    assert [e.tasks for e in reader.pending(10, after=first.id)] == [(B,)]

    reader.done([first.id, second.id])

    assert reader.pending(10) == []
    assert redis_client.xlen(keys.node_starts(NODE)) == 0  # the stream keeps only the undone


def test_a_pending_entry_trimmed_away_reads_as_naming_nothing(redis_client: redis.Redis,
                                                              reader: StartReader) -> None:
    starts.send(redis_client, {NODE: [A]})
    (entry,) = reader.take(10, 100)
    redis_client.xtrim(keys.node_starts(NODE), maxlen=0)

    (again,) = reader.pending(10)

    assert (again.id, again.tasks) == (entry.id, ())


def test_a_deleted_stream_is_joined_again(redis_client: redis.Redis,
                                          reader: StartReader) -> None:
    redis_client.delete(keys.node_starts(NODE))

    assert reader.take(10, 100) == []  # NOGROUP: joined again, nothing lost but the stream

    starts.send(redis_client, {NODE: [A]})
    assert [e.tasks for e in reader.take(10, 100)] == [(A,)]


def test_an_entry_that_does_not_parse_names_nothing() -> None:
    assert starts.parse("1-0", {"tasks": "not json"}).tasks == ()
    assert starts.parse("1-0", {"other": "[]"}).tasks == ()
    assert starts.parse("1-0", {"tasks": '[["a", "x", "main", 0]]'}).tasks == ()
    assert starts.parse("1-0", {"tasks": '[["a", "1", "main", 2]]'}).tasks == (("a", 1, "main", 2),)


def test_the_stream_of_a_node_no_launcher_reads_is_bounded(redis_client: redis.Redis) -> None:
    for _ in range(MAX_ENTRIES * 2):
        starts.send(redis_client, {NODE: [A]})

    assert redis_client.xlen(keys.node_starts(NODE)) < MAX_ENTRIES * 2


# ------------------------------------------------------------------ the feed


class Starter:
    """A start callable: records each call; raises for the tasks told to."""

    def __init__(self, fail_once: set[StartRef] | None = None) -> None:
        self.calls: queue.Queue[StartRef] = queue.Queue()
        self.fail_once = set(fail_once or ())
        self.release = threading.Event()
        self.release.set()

    def __call__(self, job_id: str, attempt: int, role: str, index: int) -> None:
        task = (job_id, attempt, role, index)
        self.release.wait(HOLD_SECONDS)
        self.calls.put(task)
        if task in self.fail_once:
            self.fail_once.discard(task)
            raise RuntimeError("Docker said no")

    def next(self) -> StartRef:
        return self.calls.get(timeout=WAIT_SECONDS)


@pytest.fixture
def running_feed(reader: StartReader) -> Iterator[Callable[[Starter], StartFeed]]:
    with ExitStack() as feeds:
        def run(starter: Starter) -> StartFeed:
            feed = StartFeed(reader, starter, slots=2, block_ms=100)
            feeds.enter_context(looping(feed.run))
            return feed

        yield run


def wait_done(r: redis.Redis, feed: StartFeed) -> None:
    """Until the feed holds nothing and the stream is empty (an entry is
    deleted just after its last start returns)."""
    with feed.lock:
        assert feed.lock.wait_for(lambda: feed.running == 0, WAIT_SECONDS)
    emptied = threading.Event()
    for _ in range(WAIT_SECONDS * 100):
        if r.xlen(keys.node_starts(NODE)) == 0:
            emptied.set()
            break
        emptied.wait(0.01)
    assert emptied.is_set(), "the feed did not finish its entries"


def test_the_feed_starts_each_task_sent_and_deletes_its_entry(
        redis_client: redis.Redis, running_feed: Callable[[Starter], StartFeed]) -> None:
    starter = Starter()
    feed = running_feed(starter)

    starts.send(redis_client, {NODE: [A, B]})
    starts.send(redis_client, {NODE: [C]})

    assert {starter.next() for _ in range(3)} == {A, B, C}
    wait_done(redis_client, feed)
    assert pending_count(redis_client) == 0
    assert starter.calls.empty()


def test_a_predecessors_pending_entry_is_started_by_the_next_feed(
        redis_client: redis.Redis, reader: StartReader,
        running_feed: Callable[[Starter], StartFeed]) -> None:
    """A launcher killed between taking an entry and finishing its starts:
    the one after it (the same consumer of the group) starts them."""
    starts.send(redis_client, {NODE: [A]})
    assert [e.tasks for e in reader.take(10, 100)] == [(A,)]  # taken by the one killed

    starter = Starter()
    feed = running_feed(starter)

    assert starter.next() == A
    wait_done(redis_client, feed)
    assert pending_count(redis_client) == 0


def test_a_start_that_raised_is_left_pending_and_handed_out_again(
        redis_client: redis.Redis, running_feed: Callable[[Starter], StartFeed]) -> None:
    starter = Starter(fail_once={B})
    feed = running_feed(starter)

    starts.send(redis_client, {NODE: [A, B]})
    assert {starter.next(), starter.next()} == {A, B}
    with feed.lock:  # until both starts returned
        assert feed.lock.wait_for(lambda: feed.running == 0, WAIT_SECONDS)
    assert pending_count(redis_client) == 1  # the entry waits, whole

    feed.recover()  # what the feed does every RECOVER_SECONDS

    assert {starter.next(), starter.next()} == {A, B}  # both again: a start is idempotent
    wait_done(redis_client, feed)
    assert pending_count(redis_client) == 0


def test_the_feed_takes_no_more_than_its_free_slots(
        redis_client: redis.Redis, running_feed: Callable[[Starter], StartFeed]) -> None:
    """A burst waits in Redis, not in the launcher: with both slots busy,
    nothing more is taken."""
    starter = Starter()
    starter.release.clear()  # every start blocks until released
    feed = running_feed(starter)
    for task in (A, B, C):
        starts.send(redis_client, {NODE: [task]})

    with feed.lock:  # until both slots are taken
        assert feed.lock.wait_for(lambda: feed.running == 2, WAIT_SECONDS)
    assert pending_count(redis_client) == 2
    assert redis_client.xinfo_groups(keys.node_starts(NODE))[0]["lag"] == 1

    starter.release.set()
    assert {starter.next() for _ in range(3)} == {A, B, C}
    wait_done(redis_client, feed)
