"""A pass reads a running job's fields whole only when its record moved.

The scheduler hands Redis the stamp (`version:queue_seq:mode`) of each
running job's record it holds; Redis sends the fields again only when the
stamp changed: a new version (every write but the waiting reason and the
mode), a new submission under the name, or a new mode.
"""

from __future__ import annotations

import pytest

from services.scheduler import reading
from services.scheduler.decisions import RunningJob
from services.scheduler.service import Scheduler
from shared.domain.cluster import BORROWED, GUARANTEED
from shared.state import keys
from shared.state.lifecycle import ModeChange, mark_preempted, set_modes, submit_job
from shared.state.store import Store
from tests.support.scheduling import add_node, config, scheduler, store

pytestmark = pytest.mark.redis
__all__ = ["scheduler", "store"]  # the fixtures, used by name


@pytest.fixture(autouse=True)
def every_record_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """These write records by hand, without the feed of job changes: each
    pass here asks Redis about every record, and the stamps decide
    (tests/integration/test_queue_feed.py has the passes that ask less)."""
    monkeypatch.setattr(reading, "FULL_READ_SECONDS", 0.0)


def running(scheduler: Scheduler, store: Store) -> dict[str, RunningJob]:
    snapshot = scheduler.reader.snapshot()
    return {job.job_id: job for job in scheduler.reader.running(snapshot.allocations)}


def placed(store: Store, scheduler: Scheduler, *names: str) -> None:
    add_node(store, gpus=8)
    for name in names:
        submit_job(store, "alice", config(name))
    scheduler.run_pass()


def test_an_unchanged_running_job_is_not_read_again(store: Store, scheduler: Scheduler) -> None:
    placed(store, scheduler, "a", "b")
    first = running(scheduler, store)
    assert set(first) == {"alice~a", "alice~b"}
    again = running(scheduler, store)
    assert again["alice~a"] is first["alice~a"]
    assert again["alice~b"] is first["alice~b"]


def test_a_new_mode_is_seen_though_it_moves_no_version(
        store: Store, scheduler: Scheduler) -> None:
    placed(store, scheduler, "a")
    first = running(scheduler, store)["alice~a"]
    mode = BORROWED if first.mode == GUARANTEED else GUARANTEED
    version = store.r.hget(keys.job("alice~a"), "version")
    assert set_modes(store, [ModeChange("alice~a", first.attempt, mode)]) == ["alice~a"]
    assert store.r.hget(keys.job("alice~a"), "version") == version
    assert running(scheduler, store)["alice~a"].mode == mode


def test_a_preemption_is_seen(store: Store, scheduler: Scheduler) -> None:
    placed(store, scheduler, "a")
    first = running(scheduler, store)["alice~a"]
    assert first.preempted_by == ""
    assert mark_preempted(store, "alice~a", attempt=first.attempt, by="bob~urgent",
                          deadline_ms=4_000_000_000_000) is not None
    now = running(scheduler, store)["alice~a"]
    assert (now.preempted_by, now.preempt_deadline_ms) == ("bob~urgent", 4_000_000_000_000)


def test_a_record_that_moved_or_lost_its_stamp_is_read_whole(
        store: Store, scheduler: Scheduler) -> None:
    placed(store, scheduler, "a", "b", "c")
    first = running(scheduler, store)
    store.r.hset(keys.job("alice~a"), "priority", "prod")  # a write that moves the version:
    store.r.hincrby(keys.job("alice~a"), "version", 1)
    store.r.hset(keys.job("alice~b"), "vc_seen", "x")  # a field the pass does not read
    store.r.hdel(keys.job("alice~c"), "queue_seq")  # a record of an old version: no stamp
    again = running(scheduler, store)
    assert again["alice~a"] is not first["alice~a"]
    assert again["alice~a"].priority != first["alice~a"].priority
    assert again["alice~b"] is first["alice~b"]
    assert again["alice~c"] is not first["alice~c"]
    assert running(scheduler, store)["alice~c"] is not again["alice~c"]  # never held
