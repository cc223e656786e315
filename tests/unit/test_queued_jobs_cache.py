"""The pass's queued records (shared/state/store/nodes.py `_queued_jobs`): Redis sends a
record again only when its version or submission moved (None: unchanged),
and only what it sends is parsed; it sends the fields a pass decides on
(`QUEUED_FIELDS`), which read as the whole record's parse reads them."""

from __future__ import annotations

import pytest

from shared.domain.models import Job
from shared.state.store import QueuedJob
from shared.state.store.nodes import QUEUED_FIELDS, _queued_jobs


def values(record: dict[str, str]) -> list[str | None]:
    """The record's QUEUED_FIELDS as HMGET sends them (None: no such field)."""
    return [record.get(name) for name in QUEUED_FIELDS]


def fields(job_id: str, version: int, seq: int = 7, **extra: str) -> list[str | None]:
    return values({"id": job_id, "state": "WAITING", "version": str(version),
                   "queue_seq": str(seq), **extra})


@pytest.mark.parametrize("record", [
    {"state": "WAITING", "version": "3", "queue_seq": "12", "attempt": "0"},
    {"state": "WAITING", "version": "9", "queue_seq": "4", "attempt": "2",
     "retry_after_ms": "1795972557148", "waiting_reason": "no GPU free",
     "waiting": '{"code":"gpus"}'},
    {"state": "RUNNING", "version": "5", "queue_seq": "1", "attempt": "1",
     "retry_after_ms": "", "waiting_reason": "", "waiting": ""},
    {"state": "WAITING", "version": "1", "queue_seq": "2", "retry_after_ms": "None"},
])
def test_the_fields_read_as_the_whole_record_reads_them(record: dict[str, str]) -> None:
    whole = Job.from_fields({"id": "alice~a", "username": "alice", "name": "a",
                             "created_ms": "1", **record})
    queued = QueuedJob.from_values("alice~a", values({**record, "ask": "[1]"}))
    assert queued.ask == "[1]"  # the ask is not the Job's (shared/domain/asks.py)
    decided_on = [name for name in vars(queued) if name != "ask"]
    assert {name: getattr(queued, name) for name in decided_on} == \
        {name: getattr(whole, name) for name in decided_on}


def test_a_record_redis_did_not_send_again_is_the_one_held() -> None:
    known: dict[str, tuple[str, QueuedJob]] = {}
    first = _queued_jobs(["alice~a"], [fields("alice~a", 1)], known)
    assert known["alice~a"][0] == "1:7"
    again = _queued_jobs(["alice~a"], [None], known)
    assert again[0][1] is first[0][1]


def test_a_record_sent_again_is_parsed_again() -> None:
    known: dict[str, tuple[str, QueuedJob]] = {}
    _queued_jobs(["alice~a", "alice~b"], [fields("alice~a", 1), fields("alice~b", 1)], known)
    changed = _queued_jobs(["alice~a", "alice~b"],
                           [fields("alice~a", 2), fields("alice~b", 1, seq=9)], known)
    assert [(job_id, job.version, job.queue_seq) for job_id, job in changed
            if job is not None] == [("alice~a", 2, 7), ("alice~b", 1, 9)]
    assert known["alice~a"][0] == "2:7" and known["alice~b"][0] == "1:9"


def test_a_record_that_is_gone_is_none_and_nothing_is_kept_for_it() -> None:
    known: dict[str, tuple[str, QueuedJob]] = {}
    _queued_jobs(["alice~gone"], [fields("alice~gone", 1)], known)
    gone = [None] * len(QUEUED_FIELDS)  # HMGET of a key that is gone
    assert _queued_jobs(["alice~gone"], [gone], known) == [("alice~gone", None)]
    assert known == {}


def test_a_record_without_version_or_submission_is_never_held() -> None:
    known: dict[str, tuple[str, QueuedJob]] = {}
    _queued_jobs(["alice~old"], [values({"state": "WAITING"})], known)
    assert known == {}


def test_jobs_no_longer_queued_are_forgotten_once_they_outnumber_the_queue() -> None:
    known: dict[str, tuple[str, QueuedJob]] = {}
    ids = [f"alice~j{i}" for i in range(1500)]
    _queued_jobs(ids, [fields(i, 1) for i in ids], known)
    _queued_jobs(ids[:10], [None] * 10, known)
    assert set(known) == set(ids[:10])
