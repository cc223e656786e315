"""The process's keyword index follows Redis's all-jobs index: new jobs,
jobs removed by retention, and a name used again."""

from __future__ import annotations

import pytest
import redis

from shared.state import keys
from shared.state.nameindex import CHUNK_NAMES, NameIndex

pytestmark = pytest.mark.redis


def _add(r: redis.Redis, *entries: tuple[str, int]) -> None:
    r.zadd(keys.JOBS, dict(entries))


def test_newest_first_any_case_and_by_name_only(redis_client: redis.Redis) -> None:
    _add(redis_client, ("alice~bert-1", 1), ("bob~BERT-2", 2), ("alice~gpt", 3), ("bert~x", 4))
    index = NameIndex(redis_client)

    assert index.search("Bert") == ["bob~BERT-2", "alice~bert-1"]
    assert index.search("bert", limit=1) == ["bob~BERT-2"]
    assert index.search("nothing") == []


def test_jobs_submitted_later_are_found_without_a_reload(redis_client: redis.Redis) -> None:
    _add(redis_client, ("alice~run-1", 10))
    index = NameIndex(redis_client)
    assert index.search("run") == ["alice~run-1"]

    _add(redis_client, ("alice~run-2", 10), ("alice~run-3", 11))  # one scored like the last seen

    assert index.search("run") == ["alice~run-3", "alice~run-2", "alice~run-1"]
    assert index.reloads == 0  # each search only read what was new


def test_a_job_removed_by_retention_is_gone(redis_client: redis.Redis) -> None:
    _add(redis_client, ("alice~run-1", 1), ("alice~run-2", 2))
    index = NameIndex(redis_client)
    assert index.search("run") == ["alice~run-2", "alice~run-1"]

    redis_client.zrem(keys.JOBS, "alice~run-1")
    _add(redis_client, ("alice~run-3", 3))  # the size alone would look unchanged

    assert index.search("run") == ["alice~run-3", "alice~run-2"]


def test_a_name_used_again_after_expiry_is_where_its_new_job_is(redis_client: redis.Redis) -> None:
    _add(redis_client, ("alice~run-1", 1), ("alice~run-2", 2))
    index = NameIndex(redis_client)
    assert index.search("run") == ["alice~run-2", "alice~run-1"]

    redis_client.zrem(keys.JOBS, "alice~run-1")
    _add(redis_client, ("alice~run-1", 3))

    assert index.search("run") == ["alice~run-1", "alice~run-2"]


def test_many_chunks_in_order(redis_client: redis.Redis) -> None:
    total = CHUNK_NAMES * 2 + 5
    pipe = redis_client.pipeline(transaction=False)
    for number in range(total):
        pipe.zadd(keys.JOBS, {f"u~job-{number}": number})
    pipe.execute()
    index = NameIndex(redis_client)

    found = index.search("job-")
    assert len(found) == total
    assert found[0] == f"u~job-{total - 1}" and found[-1] == "u~job-0"
    assert index.search(f"job-{CHUNK_NAMES}") == [f"u~job-{CHUNK_NAMES}"]
