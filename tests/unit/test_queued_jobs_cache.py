"""The pass's parsed queued records (shared/store.py `_queued_jobs`): a record
is parsed again whenever any of its fields changed, and only then."""

from __future__ import annotations

from shared.models import Job
from shared.store import _queued_jobs


def fields(job_id: str, version: int, **extra: str) -> dict[str, str]:
    return {"id": job_id, "state": "WAITING", "version": str(version), **extra}


def test_an_unchanged_record_is_not_parsed_again() -> None:
    known: dict[str, tuple[dict[str, str], Job]] = {}
    first = _queued_jobs(["alice~a"], [fields("alice~a", 1)], known)
    again = _queued_jobs(["alice~a"], [fields("alice~a", 1)], known)
    assert again[0][1] is first[0][1]


def test_any_changed_field_is_parsed_again() -> None:
    known: dict[str, tuple[dict[str, str], Job]] = {}
    _queued_jobs(["alice~a", "alice~b"], [fields("alice~a", 1), fields("alice~b", 1)], known)
    # a new version, and a field written without one (the waiting reason)
    changed = _queued_jobs(["alice~a", "alice~b"],
                           [fields("alice~a", 2), fields("alice~b", 1, waiting_reason="full")],
                           known)
    assert [(job_id, job.version, job.waiting_reason) for job_id, job in changed
            if job is not None] == [("alice~a", 2, ""), ("alice~b", 1, "full")]


def test_a_record_that_is_gone_is_none_and_nothing_is_kept_for_it() -> None:
    known: dict[str, tuple[dict[str, str], Job]] = {}
    assert _queued_jobs(["alice~gone"], [{}], known) == [("alice~gone", None)]
    assert known == {}


def test_jobs_no_longer_queued_are_forgotten_once_they_outnumber_the_queue() -> None:
    known: dict[str, tuple[dict[str, str], Job]] = {}
    ids = [f"alice~j{i}" for i in range(1500)]
    _queued_jobs(ids, [fields(i, 1) for i in ids], known)
    _queued_jobs(ids[:10], [fields(i, 1) for i in ids[:10]], known)
    assert set(known) == set(ids[:10])
