"""A pass reads a queued job's record only when it moved, and places it by
what the record says it asks for.

The snapshot hands Redis the version and submission (`queue_seq`) of each
queued record the scheduler holds; Redis sends a record again only when one
of them changed, or the record is gone. The waiting reason, written without a
new version, is the pass's own, and the record it holds says what it wrote.
What the job asks for is on its record (shared/domain/asks.py); a record
without a readable one is placed by its config.
"""

from __future__ import annotations

import pytest

from services.scheduler.service import Scheduler
from shared.state import keys
from shared.state.lifecycle import submit_job
from shared.state.store import QueuedJob, Store
from shared.state.store.jobs import ASK_FIELD
from tests.support.scheduling import add_node, config, scheduler, store

pytestmark = pytest.mark.redis
__all__ = ["scheduler", "store"]  # the fixtures, used by name


def queued(store: Store, held: dict[str, tuple[str, QueuedJob]]
           ) -> dict[str, QueuedJob | None]:
    return dict(store.snapshot(jobs_known=held).queued)


def test_an_unchanged_record_is_not_sent_again_and_a_moved_one_is(store: Store) -> None:
    for name in ("a", "b", "c", "d"):
        submit_job(store, "alice", config(name))
    held: dict[str, tuple[str, QueuedJob]] = {}
    first = queued(store, held)
    assert set(held) == {"alice~a", "alice~b", "alice~c", "alice~d"}

    store.r.hincrby(keys.job("alice~a"), "version", 1)  # a state change moves the version
    store.r.hset(keys.job("alice~b"), "queue_seq", "999")  # a name submitted again
    store.r.delete(keys.job("alice~c"))  # gone
    again = queued(store, held)

    assert again["alice~d"] is first["alice~d"]  # not sent, not parsed
    a, b = again["alice~a"], again["alice~b"]
    assert a is not None and a is not first["alice~a"] and a.version == 2
    assert b is not None and b is not first["alice~b"] and b.queue_seq == 999
    assert again["alice~c"] is None and "alice~c" not in held


def test_the_reasons_a_pass_wrote_are_in_the_records_it_holds(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store, gpus=1)
    for name in ("a", "b", "c"):
        submit_job(store, "alice", config(name))
    scheduler.run_pass()  # a runs; b and c wait for a GPU
    for job_id in ("alice~b", "alice~c"):
        stored = store.get_job(job_id)
        held = scheduler.reader.jobs[job_id][1]
        assert stored is not None and stored.waiting_reason
        assert (held.waiting_reason, held.waiting) == (stored.waiting_reason, stored.waiting)
    records = {job_id: scheduler.reader.jobs[job_id][1] for job_id in ("alice~b", "alice~c")}
    scheduler.run_pass()
    assert all(scheduler.reader.jobs[job_id][1] is job for job_id, job in records.items())


def placed(store: Store, job_id: str) -> bool:
    job = store.get_job(job_id)
    return job is not None and not job.waiting_reason and \
        store.r.zscore(keys.QUEUE, job_id) is None


def test_a_pass_places_a_job_by_the_ask_on_its_record_not_its_config(
        store: Store, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> None:
    add_node(store, gpus=2)
    submit_job(store, "alice", config("a", gpus=2))
    assert store.r.hget(keys.job("alice~a"), ASK_FIELD)
    monkeypatch.setattr(Store, "read_configs", None)  # a pass that read it would fail
    scheduler.run_pass()
    assert placed(store, "alice~a")
    assert [t.gpus for t in store.get_tasks("alice~a", 0)] == [[0, 1]]


def test_a_queued_job_whose_config_is_gone_leaves_the_queue_unplaced(
        store: Store, scheduler: Scheduler) -> None:
    add_node(store, gpus=2)
    submit_job(store, "alice", config("a", gpus=2))
    store.r.delete(keys.job_config("alice~a"))  # a damaged record: it could never start
    scheduler.run_pass()
    assert store.r.zscore(keys.QUEUE, "alice~a") is None
    assert store.get_allocations(store.r, "n1") == {}


def test_a_running_jobs_grace_is_its_asks(store: Store, scheduler: Scheduler,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    add_node(store, gpus=2)
    submit_job(store, "alice", {**config("a", gpus=2), "preemptionGracePeriodSec": 45})
    scheduler.run_pass()
    monkeypatch.setattr(Store, "read_configs", None)
    (job,) = scheduler.reader.running(store.snapshot().allocations)
    assert job.grace_ms == 45_000


@pytest.mark.parametrize("ask", [None, "not an ask", '[2,"default","test",null,true,[]]'])
def test_a_record_without_a_readable_ask_is_placed_by_its_config(
        store: Store, scheduler: Scheduler, ask: str | None) -> None:
    add_node(store, gpus=2)
    submit_job(store, "alice", config("a", gpus=2))
    if ask is None:  # a record written before the field
        store.r.hdel(keys.job("alice~a"), ASK_FIELD)
    else:
        store.r.hset(keys.job("alice~a"), ASK_FIELD, ask)
    scheduler.run_pass()
    assert placed(store, "alice~a")
    assert [t.gpus for t in store.get_tasks("alice~a", 0)] == [[0, 1]]
