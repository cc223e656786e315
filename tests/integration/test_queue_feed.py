"""A pass asks Redis only about the queued records the feed of job changes
names since the last pass (shared/state/jobfeed.py, `Store.snapshot`'s
`feed`), and about every one when the feed cannot say: trimmed past the
reader, a new feed, FEED_READ entries, another replica's pass between, or
FULL_READ_SECONDS since the last such read. What the feed does not carry
(a gang's commit, a mode) the pass forgets itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from services.scheduler import reading
from services.scheduler.service import Scheduler
from shared.infra.config import Settings
from shared.infra.messaging import Messenger, make_celery
from shared.state import keys
from shared.state.accounts import Accounts, VirtualCluster
from shared.state.jobfeed import FeedPosition
from shared.state.lifecycle import submit_job
from shared.state.store import QueuedJob, Snapshot, Store, nodes
from tests.support.scheduling import add_node, config, scheduler, store

pytestmark = pytest.mark.redis
__all__ = ["scheduler", "store"]  # the fixtures, used by name

JOBS = ("alice~a", "alice~b", "alice~c")


def read(store: Store, held: dict[str, tuple[str, QueuedJob]],
         feed: FeedPosition | None) -> Snapshot:
    return store.snapshot(jobs_known=held, feed=feed)


def queued_three(store: Store) -> tuple[dict[str, tuple[str, QueuedJob]], Snapshot]:
    for job_id in JOBS:
        submit_job(store, "alice", config(job_id.split("~")[1]))
    held: dict[str, tuple[str, QueuedJob]] = {}
    first = read(store, held, None)
    assert first.records_asked == 3 and set(held) == set(JOBS)
    return held, first


def rewrite(store: Store, job_id: str) -> None:
    """A write of the job's record as every writer but the pass makes one:
    a new version, and the feed's entry in the same transaction."""
    job = store.get_job(job_id)
    assert job is not None
    job.version += 1
    pipe = store.pipeline(atomic=True)
    store.write_job(pipe, job, job.state)
    pipe.execute()


def test_a_queue_that_did_not_move_is_not_asked_about(store: Store) -> None:
    held, first = queued_three(store)
    again = read(store, held, first.feed)
    assert again.records_asked == 0
    assert dict(again.queued) == dict(first.queued)  # the records held, as they were
    assert all(again_job is first_job for (_, again_job), (_, first_job)
               in zip(again.queued, first.queued, strict=True))


def test_a_write_and_a_new_job_are_read_from_the_feed(store: Store) -> None:
    held, first = queued_three(store)
    rewrite(store, "alice~b")
    submit_job(store, "alice", config("d"))
    again = read(store, held, first.feed)
    assert again.records_asked == 2
    records: dict[str, Any] = dict(again.queued)
    assert records["alice~b"].version == 2
    assert records["alice~d"] is not None
    assert records["alice~a"] is dict(first.queued)["alice~a"]
    assert read(store, held, again.feed).records_asked == 0


def test_a_job_gone_from_the_queue_is_gone_from_the_read(store: Store) -> None:
    held, first = queued_three(store)
    store.r.zrem(keys.QUEUE, "alice~c")
    again = read(store, held, first.feed)
    assert [job_id for job_id, _ in again.queued] == ["alice~a", "alice~b"]


@pytest.mark.parametrize("lost", ["trimmed", "new feed"])
def test_a_feed_that_cannot_say_means_every_record_is_asked_about(
        store: Store, lost: str) -> None:
    held, first = queued_three(store)
    rewrite(store, "alice~a")
    if lost == "trimmed":  # past the reader's position: the entry of a is gone
        store.r.xtrim(keys.JOB_CHANGES, maxlen=0)
    else:  # deleted and written again: fewer entries added than the reader saw
        store.r.delete(keys.JOB_CHANGES)
    rewrite(store, "alice~b")
    again = read(store, held, first.feed)
    assert again.records_asked == 3
    records: dict[str, Any] = dict(again.queued)
    assert (records["alice~a"].version, records["alice~b"].version) == (2, 2)


def test_a_write_the_feed_missed_is_read_by_the_next_full_read(
        store: Store, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    for job_id in JOBS:
        submit_job(store, "alice", config(job_id.split("~")[1]))
    assert scheduler.reader.snapshot().records_asked == 3
    store.r.hincrby(keys.job("alice~a"), "version", 1)  # by hand: no feed entry
    missed = scheduler.reader.snapshot()
    assert missed.records_asked == 0
    assert dict(missed.queued)["alice~a"].version == 1  # type: ignore[union-attr]

    monkeypatch.setattr(reading, "FULL_READ_SECONDS", 0.0)
    full = scheduler.reader.snapshot()
    assert full.records_asked == 3
    assert dict(full.queued)["alice~a"].version == 2  # type: ignore[union-attr]


def test_a_job_the_pass_placed_in_part_is_read_again(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store, gpus=1)
    part = {**config("part", tasks=2), "extras": {"gangAllocation": False}}
    submit_job(store, "alice", part)
    scheduler.run_pass()  # one task of two placed: the job stays queued, moved
    assert store.is_queued("alice~part")
    stored = store.get_job("alice~part")
    assert stored is not None and stored.version > 1
    assert "alice~part" not in scheduler.reader.jobs  # forgotten: the pass moved it

    again = scheduler.reader.snapshot()
    assert again.records_asked == 1
    held = scheduler.reader.jobs["alice~part"][1]
    assert held.version == stored.version


def test_another_replicas_pass_means_every_record_is_asked_about(
        redis_server: str, store: Store, scheduler: Scheduler) -> None:
    for job_id in JOBS:
        submit_job(store, "alice", config(job_id.split("~")[1]))
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    other = Scheduler(settings, store, Messenger(make_celery(settings)))
    assert scheduler.reader.snapshot().records_asked == 3
    assert scheduler.reader.snapshot().records_asked == 0
    assert other.reader.snapshot().records_asked == 3  # its first
    # whatever the other wrote without a feed entry, this one reads again
    assert scheduler.reader.snapshot().records_asked == 3
    assert scheduler.reader.snapshot().records_asked == 0


def asked_running(store: Store, scheduler: Scheduler,
                  monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The placed jobs' records one snapshot and running read ask Redis about."""
    asked: list[str] = []
    read = store.read_stamped_fields

    def spy(hashes: Sequence[str], *rest: Any) -> Any:
        asked.extend(hashes)
        return read(hashes, *rest)

    monkeypatch.setattr(store, "read_stamped_fields", spy)
    snapshot = scheduler.reader.snapshot()
    scheduler.reader.running(snapshot.allocations)
    monkeypatch.setattr(store, "read_stamped_fields", read)
    return asked


def test_a_placed_job_is_asked_about_when_the_feed_names_it(
        store: Store, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    add_node(store, gpus=8)
    for job_id in JOBS:
        submit_job(store, "alice", config(job_id.split("~")[1]))
    scheduler.run_pass()
    assert sorted(asked_running(store, scheduler, monkeypatch)) == [keys.job(j) for j in JOBS]
    assert asked_running(store, scheduler, monkeypatch) == []
    rewrite(store, "alice~b")
    assert asked_running(store, scheduler, monkeypatch) == [keys.job("alice~b")]
    running = {r.job_id: r for r in scheduler.reader.running(
        store.snapshot().allocations)}
    assert set(running) == set(JOBS)


def test_a_mode_the_pass_set_is_read_again(
        store: Store, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    add_node(store, gpus=8)
    Accounts(store).put_vc(VirtualCluster("research", 2))
    submit_job(store, "alice", {**config("big", gpus=4), "virtualCluster": "research"})
    scheduler.run_pass()  # over the VC's 2 guaranteed GPUs: it borrows
    asked_running(store, scheduler, monkeypatch)
    Accounts(store).put_vc(VirtualCluster("research", 4))
    scheduler.run_pass()  # now inside the guarantee: promoted, a mode without a feed entry
    stored = store.r.hget(keys.job("alice~big"), "mode")
    assert asked_running(store, scheduler, monkeypatch) == [keys.job("alice~big")]
    [job] = scheduler.reader.running(store.snapshot().allocations)
    assert job.mode == stored


def test_a_job_named_while_out_of_the_queue_is_read_when_it_is_back(store: Store) -> None:
    held, first = queued_three(store)
    # out of the queue (stopped, or past the queue's limit) when its write
    # comes through the feed, or the write between the queue's read and the feed's
    store.r.zrem(keys.QUEUE, "alice~b")
    rewrite(store, "alice~b")
    away = read(store, held, first.feed)
    assert "alice~b" not in dict(away.queued)
    store.r.zadd(keys.QUEUE, {"alice~b": 2})  # back, the feed's entry read already
    back = read(store, held, away.feed)
    assert back.records_asked == 1
    assert dict(back.queued)["alice~b"].version == 2  # type: ignore[union-attr]


def test_as_many_entries_as_a_read_takes_mean_every_record_is_asked_about(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    held, first = queued_three(store)
    monkeypatch.setattr(nodes, "FEED_READ", 2)
    rewrite(store, "alice~a")
    one = read(store, held, first.feed)
    assert one.records_asked == 1
    rewrite(store, "alice~a")
    rewrite(store, "alice~b")
    assert read(store, held, one.feed).records_asked == 3


def test_a_first_read_before_any_job_changed(store: Store) -> None:
    assert not store.r.exists(keys.JOB_CHANGES)
    first = read(store, {}, None)
    assert first.queued == [] and first.feed == FeedPosition("0-0", 0)
    submit_job(store, "alice", config("a"))
    held: dict[str, tuple[str, QueuedJob]] = {}
    again = read(store, held, first.feed)
    assert again.records_asked == 1 and set(held) == {"alice~a"}


def test_a_snapshot_that_failed_after_another_replicas_pass_is_followed_by_a_full_read(
        redis_server: str, store: Store, scheduler: Scheduler,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for job_id in JOBS:
        submit_job(store, "alice", config(job_id.split("~")[1]))
    settings = Settings(redis_url=redis_server, node_lost_seconds=30)
    other = Scheduler(settings, store, Messenger(make_celery(settings)))
    scheduler.reader.snapshot()
    other.reader.snapshot()  # the other replica passes (and may write what the feed misses)
    parse = nodes._queued_jobs

    def fails(*args: Any) -> Any:  # after the marker was read and overwritten
        raise ConnectionError("lost between the snapshot's round trips")

    monkeypatch.setattr(nodes, "_queued_jobs", fails)
    with pytest.raises(ConnectionError):
        scheduler.reader.snapshot()
    monkeypatch.setattr(nodes, "_queued_jobs", parse)
    assert store.r.get(keys.LAST_PASSER) == scheduler.reader.name
    assert scheduler.reader.snapshot().records_asked == 3
